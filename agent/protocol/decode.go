package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Result codes the agent itself gives (contract). Failures of a host
// operation carry the agent's host error codes instead (agent/hosterr:
// exists, not_found, no_capacity, in_use, unsupported, vfio_unavailable,
// domain_not_running, invalid_argument, permission_denied,
// nvml_unavailable, timeout, host_error).
const (
	// CodeWrongHost: the command names another host (refused).
	CodeWrongHost = "wrong_host"
	// CodeExpired: the command arrived after its expires_at (refused).
	CodeExpired = "expired"
	// CodeInvalidCommand: the envelope or params are malformed (refused).
	CodeInvalidCommand = "invalid_command"
	// CodeNotOwned: remove or recreate of an mdev or VF type that the
	// agent's journal does not hold, e.g. one of Nova's (refused).
	CodeNotOwned = "not_owned"
	// CodeNotAllowed: the device or type is not on the agent's allow-list
	// ([devices] enabled_mdev_types, [mdev_<type>] device_addresses) (refused).
	CodeNotAllowed = "not_allowed"
	// CodeInterrupted: the agent stopped in the middle of the command and,
	// at restart, found it expired; what it had done was rolled back (failed).
	CodeInterrupted = "interrupted"
	// CodeVerifyFailed: verify_vgpu found no healthy vGPU of the expected
	// type in the domain (failed).
	CodeVerifyFailed = "verify_failed"
	// CodeNotConfigured: upgrade_driver reached an agent whose
	// [DEFAULT] driver_upgrade_command is empty (refused).
	CodeNotConfigured = "not_configured"
	// CodeUpgradeFailed: the driver-upgrade command exited non-zero or
	// could not start (failed); the details carry its output.
	CodeUpgradeFailed = "upgrade_failed"
	// CodeIDReused: the command's id is in the journal for a different
	// command (other kind, host, instance or params) (refused). The
	// signature codes are in sign.go.
	CodeIDReused = "id_reused"
)

// Decoding limits for outside input.
const (
	// MaxMessageBytes bounds a command, result or report body.
	MaxMessageBytes = 1 << 20
	// MaxBundleMessageBytes bounds a collect_diagnostics result that
	// carries a bundle (base64 of a tar.gz of at most 64 MiB, in practice
	// the agent's max_bundle_bytes); only such a result may pass
	// MaxMessageBytes.
	MaxBundleMessageBytes = 96 << 20
	maxIDLen              = 128
)

// ErrInvalid is wrapped by every decoding and validation error.
var ErrInvalid = errors.New("invalid message")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// DecodeCommand decodes and validates a command body. Unknown fields are
// ignored (a newer bridge may add some); a body that is not one JSON
// object, or a command missing what every command needs, is an error
// wrapping ErrInvalid. The returned command is usable for a refusal even
// on error when its ID could be read.
func DecodeCommand(body []byte) (Command, error) {
	var c Command
	if len(body) > MaxMessageBytes {
		return c, invalid("command is %d bytes, more than %d", len(body), MaxMessageBytes)
	}
	if err := decodeOne(body, &c); err != nil {
		return Command{}, invalid("command: %v", err)
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

// DecodeResult decodes a result body.
func DecodeResult(body []byte) (Result, error) {
	return DecodeResultMax(body, MaxMessageBytes)
}

// DecodeResultMax is DecodeResult with a size limit of limit bytes (the
// receiver of diagnostics bundles passes MaxBundleMessageBytes and checks
// that a result over MaxMessageBytes is one).
func DecodeResultMax(body []byte, limit int) (Result, error) {
	var r Result
	if len(body) > limit {
		return r, invalid("result is %d bytes, more than %d", len(body), limit)
	}
	if err := decodeOne(body, &r); err != nil {
		return Result{}, invalid("result: %v", err)
	}
	switch {
	case r.V != Version || !AcceptedMinor(r.Minor):
		return r, versionError("result", r.V, r.Minor)
	case r.CommandID == "":
		return r, invalid("result has no command_id")
	case r.Status != Succeeded && r.Status != Failed && r.Status != Refused:
		return r, invalid("result status %q is unknown", r.Status)
	}
	return r, nil
}

// DecodeReport decodes a report body.
func DecodeReport(body []byte) (Report, error) {
	var r Report
	if len(body) > MaxMessageBytes {
		return r, invalid("report is %d bytes, more than %d", len(body), MaxMessageBytes)
	}
	if err := decodeOne(body, &r); err != nil {
		return Report{}, invalid("report: %v", err)
	}
	switch {
	case r.V != Version || !AcceptedMinor(r.Minor):
		return r, versionError("report", r.V, r.Minor)
	case r.Host == "":
		return r, invalid("report has no host")
	}
	return r, nil
}

// versionError says why a message's schema version cannot be read, and
// which side to upgrade.
func versionError(what string, v, minor int) error {
	switch {
	case v != Version:
		return invalid("%s schema version %d is not %d", what, v, Version)
	case minor > Minor:
		return invalid("%s schema version %d.%d is newer than this side's %d.%d: upgrade this side", what, v, minor, Version, Minor)
	default:
		return invalid("%s schema version %d.%d is older than this side accepts (%d.%d and %d.%d): upgrade the sender",
			what, v, minor, Version, Minor-1, Version, Minor)
	}
}

// decodeOne decodes exactly one JSON object.
func decodeOne(body []byte, v any) error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return errors.New("not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// ValidUUID reports whether s is a canonical 8-4-4-4-12 UUID, the form the
// kernel and libvirt accept for mdevs and domains.
func ValidUUID(s string) bool { return uuidRE.MatchString(s) }

// Validate checks the fields every command needs.
func (c *Command) Validate() error {
	switch {
	case c.V != Version || !AcceptedMinor(c.Minor):
		return versionError("command", c.V, c.Minor)
	case c.ID == "":
		return invalid("command has no id")
	case len(c.ID) > maxIDLen || strings.ContainsAny(c.ID, "\x00\n/"):
		return invalid("command id is longer than %d or has forbidden characters", maxIDLen)
	case !c.Kind.Valid():
		return invalid("command kind %q is unknown", c.Kind)
	case c.Host == "":
		return invalid("command has no host")
	case c.ExpiresAt.IsZero():
		return invalid("command has no expires_at")
	case c.InstanceUUID != "" && !ValidUUID(c.InstanceUUID):
		return invalid("instance_uuid %q is not a UUID", c.InstanceUUID)
	}
	return nil
}

// Expired reports whether the command is past its expiry at now, allowing
// skew for clocks that disagree.
func (c *Command) Expired(now time.Time, skew time.Duration) bool {
	return now.After(c.ExpiresAt.Add(skew))
}

// DecodeParams decodes c.Params into v (a pointer to one of the *Params
// types) and, when v has a Validate method, validates them for c.Kind.
// Absent params decode as the zero value.
func (c *Command) DecodeParams(v any) error {
	if len(c.Params) > 0 && !bytes.Equal(bytes.TrimSpace(c.Params), []byte("null")) {
		if err := decodeOne(c.Params, v); err != nil {
			return invalid("%s params: %v", c.Kind, err)
		}
	}
	if p, ok := v.(interface{ Validate(Kind) error }); ok {
		if err := p.Validate(c.Kind); err != nil {
			return err
		}
	}
	return nil
}

// MarshalParams sets c.Params to v's JSON.
func (c *Command) MarshalParams(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	c.Params = b
	return nil
}

// Validate checks create_mdev / remove_mdev params.
func (p *MdevParams) Validate(k Kind) error {
	if p.VendorVFIO {
		if p.ParentPCI == "" {
			return invalid("%s: vendor_vfio needs parent_pci (the VF)", k)
		}
		if k == CreateMdev && !isDecimal(p.TypeID) {
			return invalid("%s: vendor_vfio type_id must be the numeric vGPU type, got %q", k, p.TypeID)
		}
		return nil
	}
	if !ValidUUID(p.MdevUUID) {
		return invalid("%s: mdev_uuid %q is not a UUID", k, p.MdevUUID)
	}
	if k == CreateMdev && (p.ParentPCI == "" || p.TypeID == "") {
		return invalid("%s: parent_pci and type_id are required", k)
	}
	return nil
}

// Validate checks attach_vgpu / detach_vgpu params.
func (p *AttachParams) Validate(k Kind) error {
	switch p.Mode {
	case ModeLive, ModeConfig, ModeCold:
	default:
		return invalid("%s: mode %q is not live, config or cold", k, p.Mode)
	}
	if p.ShutdownTimeoutSeconds < 0 {
		return invalid("%s: shutdown_timeout_seconds is negative", k)
	}
	if p.VendorVFIO {
		if p.ParentPCI == "" {
			return invalid("%s: vendor_vfio needs parent_pci (the VF)", k)
		}
		if p.TypeID != "" && !isDecimal(p.TypeID) {
			return invalid("%s: vendor_vfio type_id must be numeric, got %q", k, p.TypeID)
		}
		return nil
	}
	if !ValidUUID(p.MdevUUID) {
		return invalid("%s: mdev_uuid %q is not a UUID", k, p.MdevUUID)
	}
	if (p.ParentPCI == "") != (p.TypeID == "") {
		return invalid("%s: parent_pci and type_id go together", k)
	}
	return nil
}

// Scheduler policies of set_vgpu_scheduler.
const (
	SchedBestEffort = "best_effort"
	SchedEqualShare = "equal_share"
	SchedFixedShare = "fixed_share"
)

// Validate checks set_vgpu_scheduler params.
func (p *SchedulerParams) Validate(k Kind) error {
	if p.GPUPCI == "" {
		return invalid("%s: gpu_pci is required", k)
	}
	switch p.Policy {
	case SchedBestEffort, SchedEqualShare, SchedFixedShare:
	default:
		return invalid("%s: policy %q is not best_effort, equal_share or fixed_share", k, p.Policy)
	}
	return nil
}

// Validate checks set_clocks / reset_clocks params.
func (p *ClockParams) Validate(k Kind) error {
	if p.GPUPCI == "" {
		return invalid("%s: gpu_pci is required", k)
	}
	if k == SetClocks && p.SMMHz == 0 {
		return invalid("%s: sm_mhz is required (memory_mhz 0 keeps the memory clock)", k)
	}
	return nil
}

var cpuMaxRE = regexp.MustCompile(`^(max|[1-9][0-9]*)( [1-9][0-9]*)?$`)

// Validate checks set_vm_limits params.
func (p *LimitParams) Validate(k Kind) error {
	if p.CPUMax == "" && p.MemoryHigh == "" {
		return invalid("%s: cpu_max or memory_high is required", k)
	}
	if p.CPUMax != "" && !cpuMaxRE.MatchString(p.CPUMax) {
		return invalid("%s: cpu_max %q is not \"QUOTA PERIOD\" or \"max PERIOD\"", k, p.CPUMax)
	}
	if p.MemoryHigh != "" && p.MemoryHigh != "max" && !isDecimal(p.MemoryHigh) {
		return invalid("%s: memory_high %q is not a byte count or \"max\"", k, p.MemoryHigh)
	}
	return nil
}

// Validate checks verify_vgpu params.
func (p *VerifyParams) Validate(k Kind) error {
	if p.Count < 0 {
		return invalid("%s: count is negative", k)
	}
	if p.MdevUUID != "" && !ValidUUID(p.MdevUUID) {
		return invalid("%s: mdev_uuid %q is not a UUID", k, p.MdevUUID)
	}
	return nil
}

func isDecimal(s string) bool {
	if s == "" || len(s) > 19 {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// NewResult starts a result for c.
func NewResult(c *Command, host string, st Status) Result {
	return Result{V: Version, Minor: Minor, CommandID: c.ID, Host: host, Status: st}
}

var (
	branchRE  = regexp.MustCompile(`^[0-9]{2,4}$`)
	versionRE = regexp.MustCompile(`^[0-9]{2,4}(\.[0-9]{1,4}){1,3}$`)
)

// ValidBranch reports whether s is a driver branch ("570").
func ValidBranch(s string) bool { return branchRE.MatchString(s) }

// Validate checks upgrade_driver params: a branch of digits, and a
// version of that branch when one is given.
func (p *UpgradeParams) Validate(k Kind) error {
	switch {
	case !ValidBranch(p.Branch):
		return invalid("%s: branch %q is not a driver branch (digits, e.g. 570)", k, p.Branch)
	case p.Version != "" && (!versionRE.MatchString(p.Version) || !strings.HasPrefix(p.Version, p.Branch+".")):
		return invalid("%s: version %q is not a version of branch %s", k, p.Version, p.Branch)
	}
	return nil
}

var (
	mdevTypeRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	traitRE    = regexp.MustCompile(`^CUSTOM_[A-Z0-9_]{1,248}$`)
	pciRE      = regexp.MustCompile(`^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)
)

// Validate checks retype_gpus params: 1 to 64 GPUs of PCI addresses, mdev
// type names and custom traits, and a nova.conf change within MaxNovaConf.
func (p *RetypeParams) Validate(k Kind) error {
	if len(p.GPUs) == 0 || len(p.GPUs) > 64 {
		return invalid("%s: want 1 to 64 GPUs, got %d", k, len(p.GPUs))
	}
	if p.NovaConf == "" || len(p.NovaConf) > MaxNovaConf || strings.ContainsRune(p.NovaConf, 0) {
		return invalid("%s: nova_conf: want 1 to %d bytes of text", k, MaxNovaConf)
	}
	for _, g := range p.GPUs {
		if !pciRE.MatchString(g.PCI) {
			return invalid("%s: pci_address %q is not a PCI address (0000:3b:00.0)", k, g.PCI)
		}
		if !mdevTypeRE.MatchString(g.To) || (g.From != "" && !mdevTypeRE.MatchString(g.From)) {
			return invalid("%s: GPU %s: type %q -> %q is not an mdev type name", k, g.PCI, g.From, g.To)
		}
		if !traitRE.MatchString(g.ToTrait) || (g.FromTrait != "" && !traitRE.MatchString(g.FromTrait)) {
			return invalid("%s: GPU %s: trait %q -> %q is not a custom trait", k, g.PCI, g.FromTrait, g.ToTrait)
		}
		if (g.ProviderUUID != "" && !uuidRE.MatchString(g.ProviderUUID)) || len(g.Provider) > 255 || strings.ContainsAny(g.Provider, " \n\r") {
			return invalid("%s: GPU %s: provider %q (%q) is not a provider's uuid and name", k, g.PCI, g.ProviderUUID, g.Provider)
		}
	}
	return nil
}
