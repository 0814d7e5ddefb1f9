// SPDX-License-Identifier: Apache-2.0

package computeapi

import (
	"context"
	"net/http"
	"net/url"
	"slices"
)

// Migrate asks Nova to cold-migrate the server (POST /servers/{id}/action
// {"migrate": …}) to host, or to a host its scheduler chooses when host
// is "". Nova answers at once (202); the move runs in the background and
// ends in VERIFY_RESIZE, to confirm with ConfirmResize.
func (c *Client) Migrate(ctx context.Context, id, host, requestID string) error {
	var body any
	if host != "" {
		body = map[string]string{"host": host}
	}
	return c.action(ctx, id, "migrate", body, requestID)
}

// LiveMigrate asks Nova to live-migrate the running server
// (os-migrateLive, block_migration "auto") to host, or to a host its
// scheduler chooses when host is "". Nova answers at once (202); the
// server is ACTIVE again, on the new host or, when the migration failed,
// on its source, once its task state is empty.
func (c *Client) LiveMigrate(ctx context.Context, id, host, requestID string) error {
	var h any
	if host != "" {
		h = host
	}
	return c.action(ctx, id, "os-migrateLive", map[string]any{"host": h, "block_migration": "auto"}, requestID)
}

// Migration is one of Nova's migration records (GET /os-migrations,
// microversion 2.59+ for its UUID: the Placement consumer that holds the
// instance's allocations on its source while the move runs).
type Migration struct {
	ID         int    `json:"id"`
	UUID       string `json:"uuid"`
	Instance   string `json:"instance_uuid"`
	Type       string `json:"migration_type"` // migration, live-migration, resize, evacuation
	Status     string `json:"status"`         // queued, preparing, running, post-migrating, finished, confirmed, reverted, error, failed, cancelled, completed, done
	SourceHost string `json:"source_compute"`
	DestHost   string `json:"dest_compute"`
	CreatedAt  string `json:"created_at"`
}

// Finished reports whether the migration ran its course (whatever the
// outcome): nothing of it holds allocations any more, except a cold
// migration or resize that waits for its confirm (finished).
func (m Migration) Finished() bool {
	return slices.Contains([]string{"confirmed", "reverted", "error", "failed", "cancelled", "completed", "done"}, m.Status)
}

// Migrations lists the instance's migrations, newest first.
func (c *Client) Migrations(ctx context.Context, instance, requestID string) ([]Migration, error) {
	var out struct {
		Migrations []Migration `json:"migrations"`
	}
	o := c.opts(requestID, http.StatusOK)
	o.JSONResponse = &out
	q := url.Values{"instance_uuid": {instance}}
	if _, err := c.sc.Request(ctx, http.MethodGet, c.sc.ServiceURL("os-migrations")+"?"+q.Encode(), o); err != nil {
		return nil, classify("GET /os-migrations", err)
	}
	slices.SortStableFunc(out.Migrations, func(a, b Migration) int { return b.ID - a.ID })
	return out.Migrations, nil
}

// ServerRef is a server as the host listing names it.
type ServerRef struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Status string `json:"status"`
}

// ServersOnHost lists every project's servers on a compute host (GET
// /servers/detail?all_tenants=1&host=…, admin).
func (c *Client) ServersOnHost(ctx context.Context, host, requestID string) ([]ServerRef, error) {
	var out struct {
		Servers []ServerRef `json:"servers"`
	}
	o := c.opts(requestID, http.StatusOK)
	o.JSONResponse = &out
	q := url.Values{"all_tenants": {"1"}, "host": {host}}
	if _, err := c.sc.Request(ctx, http.MethodGet, c.sc.ServiceURL("servers", "detail")+"?"+q.Encode(), o); err != nil {
		return nil, classify("GET /servers/detail", err)
	}
	return out.Servers, nil
}
