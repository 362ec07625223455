// Package migrations embeds the SQL files in this folder so that every binary
// (the functions, the local runner, the tests) applies the same schema through
// the one runner in internal/migrate.
//
// Files are named NNNN_description.sql and applied in lexical order, each in
// its own transaction. Never edit a file that has shipped: add a new one.
package migrations

import "embed"

// FS holds the *.sql files of this folder.
//
//go:embed *.sql
var FS embed.FS
