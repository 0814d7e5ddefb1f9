package controls

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/controls/controlswire"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/ingest"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// ReplayAnswer is the answer of POST /v1/dead-letters/{id}/replay.
type ReplayAnswer = controlswire.ReplayAnswer

func (a *API) replay(c echo.Context) error {
	ctx := c.Request().Context()
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id < 1 {
		return api.ValidationProblem([]api.InvalidParam{{Name: "id", Reason: "a dead letter's id (GET /v1/dead-letters)"}})
	}
	if a.Replayer == nil {
		return api.Problem(http.StatusNotImplemented, "Replay not available", "this bridge runs no notification consumer")
	}
	var source, reason string
	var raw []byte
	var truncated bool
	err = a.Store.pool.QueryRow(ctx, `SELECT source, reason, raw, raw_truncated FROM dead_letters WHERE id = $1`, id).
		Scan(&source, &reason, &raw, &truncated)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.Problem(http.StatusNotFound, "Dead letter not found", fmt.Sprintf("no dead letter has id %d (purged, or never kept)", id))
	}
	if err != nil {
		return err
	}
	who := actor(c)
	obj := strconv.FormatInt(id, 10)
	refuse := func(status int, code, outcome, detail string) error {
		a.Store.m.replays.WithLabelValues(outcome).Inc()
		if err := Audit(ctx, a.Store.pool, Entry{Actor: who, Action: "dead_letter.replay", ObjectType: "dead_letter", ObjectID: obj,
			Detail: map[string]any{"outcome": outcome, "code": code, "detail": detail, "source": source, "reason": reason}}); err != nil {
			return err
		}
		p := api.Problem(status, "Dead letter not replayed", detail)
		p.Code = code
		return p
	}
	switch {
	case source != a.Replayer.Source():
		return refuse(http.StatusConflict, "not_replayable", "refused",
			fmt.Sprintf("dead letters of source %q cannot be replayed; only those of %q (Nova notifications) can", source, a.Replayer.Source()))
	case truncated:
		return refuse(http.StatusConflict, "raw_truncated", "refused",
			"the stored body was capped at [notifications] dead_letter_max_bytes when it was kept; a partial message cannot be replayed")
	case len(raw) == 0:
		return refuse(http.StatusConflict, "raw_missing", "refused", "no body was kept for this dead letter")
	}
	res, err := a.Replayer.Replay(ctx, raw)
	if err != nil {
		return err
	}
	if !res.Accepted && !res.Duplicate {
		return refuse(http.StatusUnprocessableEntity, "still_invalid", "still_invalid",
			fmt.Sprintf("the body is still refused (%s): %s", res.Reason, res.Detail))
	}
	out := ReplayAnswer{DeadLetterID: id, Outcome: "accepted", EventID: res.EventID, MessageID: res.MessageID, EventType: res.EventType}
	if res.Duplicate {
		out.Outcome = "duplicate"
		if err := a.Store.pool.QueryRow(ctx, `SELECT id FROM events WHERE source = $1 AND message_id = $2`, source, res.MessageID).
			Scan(&out.EventID); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
	}
	err = pgx.BeginFunc(ctx, a.Store.pool, func(tx pgx.Tx) error {
		if err := ingest.MarkReplayed(ctx, tx, id, who.Name, out.EventID); err != nil {
			return err
		}
		return Audit(ctx, tx, Entry{Actor: who, Action: "dead_letter.replay", ObjectType: "dead_letter", ObjectID: obj,
			Detail: map[string]any{"outcome": out.Outcome, "event_id": out.EventID, "message_id": out.MessageID, "reason": reason}})
	})
	if err != nil {
		return err
	}
	a.Store.m.replays.WithLabelValues(out.Outcome).Inc()
	a.Store.log.Info("dead letter replayed", logkey.Object, id, "outcome", out.Outcome, "event_id", out.EventID, logkey.Actor, who.Name, logkey.GlobalRequestID, who.RequestID)
	return c.JSON(http.StatusOK, out)
}
