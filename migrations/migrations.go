// Package migrations embeds the SQL files in this folder so that every binary
// (the functions, the local runner, the tests) applies the same schema through
// the one runner in internal/migrate.
//
// Files are named NNNN_description.sql and applied in lexical order, each in
// its own transaction. Never edit a file that has shipped: add a new one.
//
// The numbers have gaps: 0006, 0008 and 0009 never existed (no file with
// those numbers was ever committed, so no database has applied one; nothing
// is missing). The runner records each applied file by its version
// (schema_migrations) and needs no sequence, so a gap is harmless. Do not
// fill one: a new migration takes a number above the highest.
package migrations

import "embed"

// FS holds the *.sql files of this folder.
//
//go:embed *.sql
var FS embed.FS
