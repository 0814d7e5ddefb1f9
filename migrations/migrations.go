// Package migrations holds the bridge's database schema as numbered,
// forward-only goose SQL files, embedded in the binary.
//
// Never edit a migration that has landed: add a new one.
package migrations

import "embed"

// FS holds every NNNNN_name.sql file.
//
//go:embed *.sql
var FS embed.FS
