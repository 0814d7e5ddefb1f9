package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
)

// watchFlags are the flags of commands that wait for a request.
type watchFlags struct {
	interval, limit time.Duration
}

func (wf *watchFlags) add(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&wf.interval, "interval", time.Second, "with --watch: time between polls")
	cmd.Flags().DurationVar(&wf.limit, "wait-timeout", 0, "with --watch: give up (exit 6) after this long; 0 waits until Ctrl-C")
}

func requestsCmd(g *globals) *cobra.Command {
	var f apiclient.RequestFilter
	cmd := &cobra.Command{
		Use:   "requests",
		Short: "List requests, newest first; show, watch or cancel one",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rl, err := g.api().Requests(cmd.Context(), f)
			if err != nil {
				return err
			}
			return g.emit(rl.Raw, func(w io.Writer) {
				header(w, "ID", "SOURCE", "KIND", "INSTANCE", "STATE", "PHASE", "CODE", "UPDATED")
				for _, r := range rl.Requests {
					row(w, r.ID, r.Source, r.Kind, r.InstanceUUID, r.State, r.Phase, r.Code, ts(r.UpdatedAt))
				}
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.State, "state", "", "only this state: accepted, decided, dispatched, succeeded, failed, rejected")
	fl.StringVar(&f.Source, "source", "", "only this source, e.g. webhook:batch-scheduler")
	fl.StringVar(&f.InstanceUUID, "instance", "", "only requests about this instance UUID")
	fl.IntVar(&f.Limit, "limit", 0, "most requests listed (1-1000; the bridge's default is 100)")
	cmd.RegisterFlagCompletionFunc("state", cobra.FixedCompletions([]string{"accepted", "decided", "dispatched", "succeeded", "failed", "rejected"}, cobra.ShellCompDirectiveNoFileComp))

	var watch bool
	var wf watchFlags
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one request; with --watch, wait until it is final (exit 5 if it failed or was rejected)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !watch {
				r, err := g.api().Request(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return g.emit(r.Raw, func(w io.Writer) { requestKV(w, r) })
			}
			return g.watchAndShow(cmd.Context(), args[0], wf)
		},
	}
	show.Flags().BoolVarP(&watch, "watch", "w", false, "poll until the request reaches a final state (a spinner on a terminal)")
	wf.add(show)
	cmd.AddCommand(show)

	cmd.AddCommand(&cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a request that is not final: it ends failed with code cancelled (admin)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := g.api().CancelRequest(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return g.emit(r.Raw, func(w io.Writer) { requestKV(w, r) })
		},
	})
	return cmd
}

func requestKV(w io.Writer, r apiclient.Request) {
	kv(w, "ID", r.ID, "Source", r.Source, "Kind", r.Kind, "Instance", r.InstanceUUID,
		"State", r.State, "Phase", r.Phase, "Reason", r.Reason, "Code", r.Code,
		"Callback URL", r.CallbackURL, "Body", clip(compact(r.Body), 200),
		"Created", ts(r.CreatedAt), "Updated", ts(r.UpdatedAt), "Decided", tsp(r.DecidedAt),
		"Dispatched", tsp(r.DispatchedAt), "Finished", tsp(r.FinishedAt))
}

func describe(r apiclient.Request) string {
	s := r.State
	if r.Phase != "" {
		s += " (" + r.Phase + ")"
	}
	if r.Code != "" {
		s += " code " + r.Code
	}
	if r.Reason != "" {
		s += ": " + r.Reason
	}
	return s
}

// watchAndShow waits for request id to be final, prints it, and maps a
// failed or rejected end to exit 5.
func (g *globals) watchAndShow(ctx context.Context, id string, wf watchFlags) error {
	r, err := g.watch(ctx, id, wf)
	if err != nil {
		return err
	}
	if err := g.emit(r.Raw, func(w io.Writer) { requestKV(w, r) }); err != nil {
		return err
	}
	if r.State != apiclient.StateSucceeded {
		return exitError{exitRequest, fmt.Errorf("request %s ended %s", id, describe(r))}
	}
	return nil
}

// watch polls request id until it is final. On a terminal a spinner shows
// the state; otherwise each change is a line on stderr.
func (g *globals) watch(ctx context.Context, id string, wf watchFlags) (apiclient.Request, error) {
	wctx := ctx
	if wf.limit > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, wf.limit)
		defer cancel()
	}
	var spin *progressbar.ProgressBar
	if g.tty != nil && g.tty() {
		spin = progressbar.NewOptions(-1, progressbar.OptionSetWriter(g.stderr), progressbar.OptionSpinnerType(14),
			progressbar.OptionSetElapsedTime(true), progressbar.OptionSetDescription("request "+id),
			progressbar.OptionClearOnFinish())
	}
	seen := func(r apiclient.Request) {
		if spin != nil {
			spin.Describe("request " + id + ": " + clip(describe(r), 60))
			return
		}
		fmt.Fprintf(g.stderr, "%s request %s: %s\n", ts(time.Now()), id, describe(r))
	}
	r, err := g.api().WatchRequest(wctx, id, wf.interval, seen)
	if spin != nil {
		spin.Finish()
		spin.Exit()
	}
	if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		state := r.State
		if state == "" {
			state = "unknown (no answer yet)"
		}
		return r, exitError{exitGaveUp, fmt.Errorf("request %s is still %s after %s", id, state, wf.limit)}
	}
	return r, err
}

// requestCmd makes a request with the caller's API credentials (POST
// /v1/requests) and follows it to its end.
func requestCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "request",
		Short: "Ask for a vGPU change with your API credentials (admin, or member of the instance's project) and follow it",
		Args:  cobra.NoArgs,
	}
	var workload, key string
	var count int
	var noWait bool
	var wf watchFlags
	sub := func(use, short, kind string, args cobra.PositionalArgs) *cobra.Command {
		c := &cobra.Command{
			Use:   use,
			Short: short,
			Args:  args,
			RunE: func(cmd *cobra.Command, args []string) error {
				r := apiclient.NewRequest{Type: kind, VMID: args[0], Workload: workload, Count: count}
				if len(args) > 1 {
					r.VGPUProfile = args[1]
				}
				ans, err := g.api().CreateRequest(cmd.Context(), r, key)
				if err != nil {
					return err
				}
				if noWait {
					return g.emit(ans.Raw, func(w io.Writer) { kv(w, "Request", ans.RequestID, "Status URL", ans.StatusURL) })
				}
				fmt.Fprintf(g.stderr, "request %s accepted\n", ans.RequestID)
				return g.watchAndShow(cmd.Context(), ans.RequestID, wf)
			},
		}
		c.Flags().StringVar(&key, "idempotency-key", "", "names the request: a retry with the same key and body gets the first answer")
		c.Flags().BoolVar(&noWait, "no-wait", false, "print the request id and return at once")
		wf.add(c)
		return c
	}
	attach := sub("attach INSTANCE PROFILE", "Give INSTANCE a vGPU of PROFILE (GPU_REQUEST), e.g. T4-4Q", "GPU_REQUEST", cobra.ExactArgs(2))
	attach.Flags().StringVar(&workload, "workload", "inference", "the workload: training, inference, rendering, vdi, gaming")
	attach.Flags().IntVar(&count, "count", 1, "how many vGPUs")
	resize := sub("resize INSTANCE PROFILE", "Move INSTANCE's vGPUs to PROFILE (GPU_RESIZE)", "GPU_RESIZE", cobra.ExactArgs(2))
	resize.Flags().StringVar(&workload, "workload", "inference", "the workload: training, inference, rendering, vdi, gaming")
	release := sub("release INSTANCE [PROFILE]", "Take INSTANCE's vGPUs back, or those of PROFILE (GPU_RELEASE)", "GPU_RELEASE", cobra.RangeArgs(1, 2))
	cmd.AddCommand(attach, resize, release)
	return cmd
}
