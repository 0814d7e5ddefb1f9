// SPDX-License-Identifier: Apache-2.0

// Package diagnostics serves remote diagnostics bundles (vgpuctl diagnose
// HOST): an operator's request queues a signed collect_diagnostics
// command (bundle: true) for the host's agent in the outbox, in the same
// transaction as the diagnostics row and its audit record; the relay
// publishes it; the agent's signed result carries the tar.gz back, and
// Results stores it (bytea) in the transaction that finishes the command.
//
//	POST /v1/hosts/{name}/diagnostics   202, the diagnostics record (admin, audited)
//	GET  /v1/diagnostics/{id}           the record: status pending | complete | failed
//	GET  /v1/diagnostics/{id}/bundle    the tar.gz once complete (409 before)
package diagnostics

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/diagnostics/diagnosticswire"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/dispatch"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// Statuses of a diagnostics record.
const (
	Pending  = "pending"
	Complete = "complete"
	Failed   = "failed"
)

// DefaultTimeout is how long an agent has to answer.
const DefaultTimeout = 10 * time.Minute

// ErrNotFound: no such host or diagnostics record.
var ErrNotFound = errors.New("not found")

// Diagnostics is one record, without its bundle.
type Diagnostics = diagnosticswire.Diagnostics

// Store reads and writes diagnostics records.
type Store struct {
	Pool *pgxpool.Pool
	Log  *slog.Logger
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Store) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// Request records a request for host's bundle (instance may be empty) and
// queues its collect_diagnostics command, with the audit record, in one
// transaction. ErrNotFound when no agent of host ever reported.
func (s *Store) Request(ctx context.Context, who controls.Actor, host, instance string, timeout time.Duration) (Diagnostics, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	now := s.now().UTC()
	id, cmdID := uuid.New(), uuid.New()
	c := protocol.Command{V: protocol.Version, ID: cmdID.String(), Kind: protocol.CollectDiagnostics, Host: host,
		InstanceUUID: instance, IssuedAt: now, ExpiresAt: now.Add(timeout)}
	if err := c.MarshalParams(protocol.DiagnosticsParams{Bundle: true}); err != nil {
		return Diagnostics{}, err
	}
	body, err := json.Marshal(c)
	if err != nil {
		return Diagnostics{}, err
	}
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		var known bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM hosts WHERE name = $1)`, host).Scan(&known); err != nil {
			return err
		}
		if !known {
			return fmt.Errorf("host %s: %w", host, ErrNotFound)
		}
		var inst *string
		if instance != "" {
			inst = &instance
		}
		if err := requests.QueueOperatorCommand(ctx, tx, requests.Command{ID: cmdID.String(), Host: host, Kind: string(c.Kind),
			Body: body, ExpiresAt: c.ExpiresAt, InstanceUUID: instance}); err != nil {
			return fmt.Errorf("queue collect_diagnostics: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO diagnostics (id, command_id, host, instance_uuid, requested_by, request_id, requested_at, expires_at)
			VALUES ($1, $2, $3, $4::uuid, $5, nullif($6, ''), $7, $8)`, id, cmdID, host, inst, who.Name, who.RequestID, now, c.ExpiresAt); err != nil {
			return fmt.Errorf("record diagnostics: %w", err)
		}
		return controls.Audit(ctx, tx, controls.Entry{Actor: who, Action: "host.diagnostics", ObjectType: "host", ObjectID: host,
			Detail: map[string]any{"diagnostics_id": id.String(), "command_id": cmdID.String(), "instance": instance}})
	})
	if err != nil {
		return Diagnostics{}, err
	}
	return s.Get(ctx, id.String())
}

// Get returns record id. A pending record whose command failed, was
// refused, answered without a bundle or passed its expiry reads as failed.
func (s *Store) Get(ctx context.Context, id string) (Diagnostics, error) {
	if _, err := uuid.Parse(id); err != nil {
		return Diagnostics{}, fmt.Errorf("diagnostics %q: %w", id, ErrNotFound)
	}
	var d Diagnostics
	var inst, errText, sum, cmdStatus, code, msg *string
	var size *int64
	var cmdFinished *time.Time
	err := s.Pool.QueryRow(ctx, `SELECT d.id::text, d.host, d.instance_uuid::text, d.requested_by, d.requested_at, d.expires_at,
			d.completed_at, d.status, d.error, d.size, d.sha256, d.manifest, d.command_id::text,
			c.finished_at, c.result_status, c.result->>'code', c.result->>'message'
		FROM diagnostics d LEFT JOIN commands c ON c.id = d.command_id WHERE d.id = $1`, id).Scan(
		&d.ID, &d.Host, &inst, &d.RequestedBy, &d.RequestedAt, &d.ExpiresAt, &d.CompletedAt, &d.Status, &errText, &size, &sum,
		&d.Manifest, &d.CommandID, &cmdFinished, &cmdStatus, &code, &msg)
	if errors.Is(err, pgx.ErrNoRows) {
		return Diagnostics{}, fmt.Errorf("diagnostics %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Diagnostics{}, fmt.Errorf("read diagnostics %s: %w", id, err)
	}
	d.Instance, d.Error, d.SHA256 = deref(inst), deref(errText), deref(sum)
	if size != nil {
		d.Size = *size
	}
	if d.Status == Pending {
		switch {
		case cmdFinished != nil && deref(cmdStatus) != string(protocol.Succeeded):
			d.Status, d.Error = Failed, fmt.Sprintf("agent of host %s: collect_diagnostics %s", d.Host, deref(cmdStatus))
			if c := deref(code); c != "" {
				d.Error += " (" + c + ")"
			}
			if m := deref(msg); m != "" {
				d.Error += ": " + m
			}
		case cmdFinished != nil:
			d.Status, d.Error = Failed, "the agent of host "+d.Host+" answered without a bundle: upgrade it to a vgpu-agent that collects bundles"
		case s.now().After(d.ExpiresAt):
			d.Status, d.Error = Failed, fmt.Sprintf("no answer from the agent of host %s before %s (is it running?)", d.Host, d.ExpiresAt.UTC().Format(time.RFC3339))
		}
	}
	if d.Status == Complete {
		d.BundleHref = "/v1/diagnostics/" + d.ID + "/bundle"
	}
	return d, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Bundle returns record id's tar.gz; ok is false while it is not complete.
func (s *Store) Bundle(ctx context.Context, id string) (d Diagnostics, bundle []byte, ok bool, err error) {
	if d, err = s.Get(ctx, id); err != nil || d.Status != Complete {
		return d, nil, false, err
	}
	if err := s.Pool.QueryRow(ctx, `SELECT bundle FROM diagnostics WHERE id = $1`, id).Scan(&bundle); err != nil {
		return d, nil, false, fmt.Errorf("read bundle %s: %w", id, err)
	}
	return d, bundle, true, nil
}

// Results takes the agents' results that carry a bundle and hands every
// other one to Next (the pipeline): a dispatch.ResultHandler.
type Results struct {
	Store *Store
	Next  dispatch.ResultHandler
}

// HandleResult stores a bundle with its command's result in one
// transaction; a duplicate, or a bundle for no diagnostics record, is
// dropped.
func (r Results) HandleResult(ctx context.Context, res protocol.Result) error {
	if !dispatch.HasBundle(res) {
		return r.Next.HandleResult(ctx, res)
	}
	return r.Store.TakeBundle(ctx, res)
}

// TakeBundle records res, a collect_diagnostics result with a bundle.
func (s *Store) TakeBundle(ctx context.Context, res protocol.Result) error {
	var d protocol.BundleDetails
	if err := json.Unmarshal(res.Details, &d); err != nil {
		s.log().Warn("diagnostics: unreadable bundle result dropped", logkey.Command, res.CommandID, logkey.Err, err)
		return nil
	}
	sum := sha256.Sum256(d.Bundle)
	digest := hex.EncodeToString(sum[:])
	return pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		var id, host, status string
		var finished *time.Time
		err := tx.QueryRow(ctx, `SELECT d.id::text, d.host, d.status, c.finished_at FROM diagnostics d JOIN commands c ON c.id = d.command_id
			WHERE d.command_id::text = $1 FOR UPDATE OF d, c`, res.CommandID).Scan(&id, &host, &status, &finished)
		if errors.Is(err, pgx.ErrNoRows) {
			s.log().Warn("diagnostics: a bundle for no diagnostics request dropped", logkey.Command, res.CommandID, logkey.Host, res.Host)
			return nil
		}
		if err != nil {
			return fmt.Errorf("bundle of command %s: %w", res.CommandID, err)
		}
		if finished != nil || status != Pending {
			return nil // a duplicate delivery
		}
		if res.Host != "" && res.Host != host {
			s.log().Warn("diagnostics: bundle from another host than the command's; dropped", logkey.Command, res.CommandID, logkey.Host, res.Host, "want", host)
			return nil
		}
		// The command's row keeps the result without the bundle itself.
		kept := res
		kept.Details = stripBundle(res.Details)
		body, err := json.Marshal(kept)
		if err != nil {
			return err
		}
		if err := requests.FinishCommand(ctx, tx, res.CommandID, string(res.Status), body); err != nil {
			return err
		}
		if res.Status != protocol.Succeeded || (d.BundleSHA256 != "" && d.BundleSHA256 != digest) {
			why := "the bundle's digest does not match the one the agent signed"
			if res.Status != protocol.Succeeded {
				why = fmt.Sprintf("collect_diagnostics %s: %s", res.Status, res.Message)
			}
			_, err := tx.Exec(ctx, `UPDATE diagnostics SET status = 'failed', error = $2, completed_at = now() WHERE id = $1`, id, why)
			return err
		}
		manifest := d.Manifest
		if len(manifest) == 0 || !json.Valid(manifest) {
			manifest = nil
		}
		_, err = tx.Exec(ctx, `UPDATE diagnostics SET status = 'complete', completed_at = now(), size = $2, sha256 = $3, manifest = $4, bundle = $5
			WHERE id = $1`, id, len(d.Bundle), digest, manifest, d.Bundle)
		if err == nil {
			s.log().Info("diagnostics: bundle stored", logkey.Host, host, "diagnostics_id", id, "size", len(d.Bundle))
		}
		return err
	})
}

func stripBundle(details json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(details, &m) != nil {
		return nil
	}
	delete(m, "bundle")
	b, _ := json.Marshal(m)
	return b
}
