package bridge

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/store"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var (
	optDBConnection = databaseOptions.Secret("database", "connection",
		"The bridge's Postgres database as a URL (libpq form). "+
			"Example: postgres://vgpu:secret@db.example.org:5432/vgpu_bridge?sslmode=verify-full")
	optDBConnectionFile = databaseOptions.String("database", "connection_file", "",
		"A file holding the connection URL, so the password stays out of this file. Wins over connection. "+
			"Example: /etc/vgpu-bridge/secrets/database")
	optDBMaxConns = databaseOptions.Int("database", "max_connections", 16, 1, 1000,
		"Most connections this replica opens. Example: 32")
	optDBConnectTimeout = databaseOptions.Duration("database", "connect_timeout", 5*time.Second, 100*time.Millisecond, 5*time.Minute,
		"How long one connection attempt may take. Example: 10s")
	optDBAutoMigrate = databaseOptions.Bool("database", "auto_migrate", false,
		"Apply pending migrations when serve starts. Off by default: operators run "+
			"`vgpu-bridge migrate up` during an upgrade, and serve refuses to start on an old schema. Example: true")
)

// databaseOptions are the options declared in this file; Options assembles them
// into the daemon's set with validateDatabase.
var databaseOptions = conf.NewGroup().
	SectionHelp("database", "The bridge's Postgres database: inventory mirror, instances, requests, outbox, inbox, audit.")

// validateDatabase tests relations between the options of this file.
func validateDatabase(v *conf.Values) conf.Errors {
	if optDBConnection.Get(v) == "" && optDBConnectionFile.Get(v) == "" {
		return conf.Errors{{Section: "database", Option: "connection", Problem: "is required (or set connection_file); allowed: postgres://user:pass@host:5432/db"}}
	}
	if c := optDBConnection.Get(v); c != "" && optDBConnectionFile.Get(v) == "" {
		if _, err := pgxpool.ParseConfig(c); err != nil {
			return conf.Errors{{Section: "database", Option: "connection", Value: c, Secret: true,
				Problem: "not a Postgres URL; allowed: postgres://user:pass@host:5432/db?sslmode=..."}}
		}
	}
	return nil
}

// StoreConfig maps [database] to store.Config.
func StoreConfig(v *conf.Values) (store.Config, error) {
	url := optDBConnection.Get(v)
	if f := optDBConnectionFile.Get(v); f != "" {
		s, err := conf.ReadSecretFile(f)
		if err != nil {
			return store.Config{}, err
		}
		url = s
	}
	return store.Config{
		URL:            url,
		MaxConns:       int32(optDBMaxConns.Get(v)),
		ConnectTimeout: optDBConnectTimeout.Get(v),
	}, nil
}
