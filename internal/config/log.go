package config

import (
	"fmt"
	"log/slog"
	"strings"
)

// LogLevel reads LOG_LEVEL: debug, info, warn or error, in any case (default
// info). Every loader refuses anything else, so that a typo fails the
// function's start instead of silently logging at info; bootstrap.Logger
// uses the same parse.
func LogLevel(env Env) (slog.Level, error) {
	raw := strings.TrimSpace(env("LOG_LEVEL"))
	switch strings.ToLower(raw) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return slog.LevelInfo, fmt.Errorf("LOG_LEVEL=%q: must be debug, info, warn or error (default info)", raw)
}

func (p *problems) logLevel(env Env) slog.Level {
	level, err := LogLevel(env)
	p.addErr("", err)
	return level
}
