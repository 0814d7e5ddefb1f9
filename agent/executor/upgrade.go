package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/agent/hosterr"
	"github.com/vgpu-bridge/vgpu-bridge/agent/protocol"
	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

const stepUpgraded = "upgraded"

// upgradeDriver runs the operator's driver-upgrade command (Config.
// UpgradeCommand, never anything the bridge sent) with the target in its
// environment, and returns its exit status and the tail of its output.
// The result is journaled like every command's, so a repeated delivery
// gets it back without running the command again.
func (e *Executor) upgradeDriver(ctx context.Context, r *run, p protocol.UpgradeParams) (any, error) {
	d := protocol.UpgradeDetails{Branch: p.Branch, Version: p.Version}
	err := e.hook(ctx, r, hookRun{argv: e.cfg.UpgradeCommand, what: "driver upgrade", option: "driver_upgrade_command",
		env: []string{"VGPU_TARGET_BRANCH=" + p.Branch, "VGPU_TARGET_VERSION=" + p.Version}}, &d)
	return d, err
}

// retypeGPUs runs the operator's re-type command (Config.RetypeCommand)
// with the nova.conf change on its standard input and in VGPU_NOVA_CONF,
// the GPUs in VGPU_RETYPE_GPUS and their providers' trait change in
// VGPU_RETYPE_TRAITS (protocol.RetypeParams).
func (e *Executor) retypeGPUs(ctx context.Context, r *run, p protocol.RetypeParams) (any, error) {
	var gpus, traits []string
	for _, g := range p.GPUs {
		gpus = append(gpus, g.PCI+"="+g.To)
		// Three fields a line, "-" for a provider or old trait unknown.
		traits = append(traits, orDash(g.ProviderUUID)+" "+orDash(g.FromTrait)+" "+g.ToTrait)
	}
	var d protocol.UpgradeDetails
	err := e.hook(ctx, r, hookRun{argv: e.cfg.RetypeCommand, what: "GPU re-type", option: "gpu_retype_command", stdin: p.NovaConf,
		env: []string{"VGPU_NOVA_CONF=" + p.NovaConf, "VGPU_RETYPE_GPUS=" + strings.Join(gpus, "\n"),
			"VGPU_RETYPE_TRAITS=" + strings.Join(traits, "\n")}}, &d)
	return d, err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// hookRun is one run of an operator's configured command.
type hookRun struct {
	argv         []string
	what, option string // "driver upgrade", its [DEFAULT] option
	env          []string
	stdin        string
}

// hook runs h (once: its step is journaled) and fills d with its exit
// status and the tail of its output.
func (e *Executor) hook(ctx context.Context, r *run, h hookRun, d *protocol.UpgradeDetails) error {
	argv := h.argv
	d.Command, d.ExitStatus = strings.Join(argv, " "), -1
	_, err := r.step(stepUpgraded, func() (string, error) {
		out := &tailBuffer{max: protocol.MaxUpgradeOutput}
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = append(append(os.Environ(), h.env...), "VGPU_COMMAND_ID="+r.c.ID)
		if h.stdin != "" {
			cmd.Stdin = strings.NewReader(h.stdin)
		}
		cmd.Stdout, cmd.Stderr = out, out
		// Its own process group, killed whole when the command times out.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 5 * time.Second
		start := time.Now()
		runErr := cmd.Run()
		d.DurationMS = time.Since(start).Milliseconds()
		d.Output, d.Truncated = out.String(), out.dropped
		if cmd.ProcessState != nil {
			d.ExitStatus = cmd.ProcessState.ExitCode()
		}
		e.log.Info(h.what+" command ended", logkey.Command, r.c.ID, "kind", r.c.Kind, "branch", d.Branch,
			"exit_status", d.ExitStatus, "duration_ms", d.DurationMS, logkey.Err, runErr)
		var exitErr *exec.ExitError
		switch {
		case runErr == nil:
			return "", nil
		case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
			return "", hosterr.Errorf(hosterr.Timeout, h.what, "%s ran past [DEFAULT] driver_upgrade_timeout and was killed", argv[0])
		case ctx.Err() != nil:
			return "", ctx.Err() // the agent is stopping: the command stays pending
		case errors.As(runErr, &exitErr):
			return "", codedError{code: protocol.CodeUpgradeFailed,
				msg:         fmt.Sprintf("%s command %s exited with status %d", h.what, argv[0], d.ExitStatus),
				remediation: "Read the command's output in the result's details, fix the host, and run it again."}
		}
		return "", codedError{code: protocol.CodeUpgradeFailed, msg: fmt.Sprintf("%s command: %v", h.what, runErr),
			remediation: "Check [DEFAULT] " + h.option + ": the executable must exist and be executable by the agent."}
	})
	if err == nil && d.ExitStatus == -1 {
		d.ExitStatus = 0 // the step was done before a crash; its output is lost
		d.Output = ""
	}
	return err
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max     int
	buf     []byte
	dropped int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.dropped += over
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return strings.ToValidUTF8(string(t.buf), "\uFFFD") }
