package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

func auditCmd(g *globals) *cobra.Command {
	var f apiclient.AuditFilter
	var since time.Duration
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "List the audit log, oldest first: who changed what, why, under which request id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if since > 0 {
				f.Since = time.Now().Add(-since)
			}
			al, err := g.api().Audit(cmd.Context(), f)
			if err != nil {
				return err
			}
			if err := g.emit(al.Raw, func(w io.Writer) {
				header(w, "ID", "AT", "ACTOR", "ACTION", "OBJECT", "REQUEST ID", "DETAIL")
				for _, r := range al.Records {
					rid := str(r.GlobalRequestID)
					if rid == "" {
						rid = str(r.RequestID)
					}
					row(w, fmt.Sprint(r.ID), ts(r.At), r.Actor, r.Action, r.ObjectType+"/"+r.ObjectID, rid, clip(compact(r.Detail), 80))
				}
			}); err != nil {
				return err
			}
			g.more(al.NextCursor)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&since, "since", 24*time.Hour, "only rows of the last DURATION (0: all)")
	fl.StringVar(&f.Actor, "actor", "", "only this actor, e.g. ops or vgpu-bridge/replica-1")
	fl.StringVar(&f.Action, "action", "", "only this action, or a prefix ending with * (host.*)")
	fl.StringVar(&f.Object, "object", "", "only this object: type/id (host/compute-1) or an id")
	fl.StringVar(&f.RequestID, "request-id", "", "only rows of this bridge request or OpenStack request id")
	fl.IntVar(&f.Limit, "limit", 0, "most rows in the page (1-1000; the bridge's default is 100)")
	fl.StringVar(&f.Cursor, "cursor", "", "next page: the cursor a previous page ended with")
	return cmd
}
