// Package pci holds the one normalised PCI address form the agent uses.
//
// Three spellings of the same function appear on a vGPU host:
//
//	NVML     00000000:3B:00.0   (32-bit domain, upper-case hex)
//	sysfs    0000:3b:00.0       (16-bit domain, lower-case hex)
//	libvirt  pci_0000_3b_00_0   (node-device name)
//
// Parse accepts all of them (and a bare "3b:00.0", domain 0); Addr is
// comparable, so it can key maps. String gives the sysfs form.
package pci

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Addr is a PCI function address.
type Addr struct {
	Domain uint16
	Bus    uint8
	Slot   uint8
	Func   uint8
}

// ErrSyntax is wrapped by every Parse error.
var ErrSyntax = errors.New("invalid PCI address")

// Parse reads an address in NVML, sysfs or libvirt form.
func Parse(s string) (Addr, error) {
	in := strings.TrimSpace(s)
	t := in
	if rest, ok := strings.CutPrefix(t, "pci_"); ok {
		// pci_DDDD_BB_SS_F
		parts := strings.Split(rest, "_")
		if len(parts) != 4 {
			return Addr{}, fmt.Errorf("%w: %q", ErrSyntax, s)
		}
		t = parts[0] + ":" + parts[1] + ":" + parts[2] + "." + parts[3]
	}
	dom := "0"
	parts := strings.Split(t, ":")
	switch len(parts) {
	case 3:
		dom = parts[0]
		parts = parts[1:]
	case 2:
	default:
		return Addr{}, fmt.Errorf("%w: %q", ErrSyntax, s)
	}
	sf := strings.Split(parts[1], ".")
	if len(sf) != 2 {
		return Addr{}, fmt.Errorf("%w: %q", ErrSyntax, s)
	}
	d, err1 := parseHex(dom, 8, 16)
	b, err2 := parseHex(parts[0], 2, 8)
	sl, err3 := parseHex(sf[0], 2, 5)
	fn, err4 := parseHex(sf[1], 1, 3)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return Addr{}, fmt.Errorf("%w: %q", ErrSyntax, s)
	}
	return Addr{Domain: uint16(d), Bus: uint8(b), Slot: uint8(sl), Func: uint8(fn)}, nil
}

// MustParse is Parse for constants in tests and fixtures; it panics on error.
func MustParse(s string) Addr {
	a, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return a
}

// parseHex parses 1..maxLen hex digits into a value of at most bits bits.
// NVML's 8-digit domain must have its upper 16 bits clear.
func parseHex(s string, maxLen, bits int) (uint64, error) {
	if s == "" || len(s) > maxLen {
		return 0, ErrSyntax
	}
	v, err := strconv.ParseUint(s, 16, 32)
	if err != nil {
		return 0, ErrSyntax
	}
	if v >= 1<<bits {
		return 0, ErrSyntax
	}
	return v, nil
}

// String is the sysfs form, e.g. "0000:3b:00.0".
func (a Addr) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.Domain, a.Bus, a.Slot, a.Func)
}

// NVML is NVML's bus id form, e.g. "00000000:3B:00.0".
func (a Addr) NVML() string {
	return fmt.Sprintf("%08X:%02X:%02X.%X", uint32(a.Domain), a.Bus, a.Slot, a.Func)
}

// Libvirt is libvirt's node-device name, e.g. "pci_0000_3b_00_0".
func (a Addr) Libvirt() string {
	return fmt.Sprintf("pci_%04x_%02x_%02x_%x", a.Domain, a.Bus, a.Slot, a.Func)
}

// IsZero reports whether a is the zero address (0000:00:00.0).
func (a Addr) IsZero() bool { return a == Addr{} }

// MarshalText encodes the sysfs form, so JSON reports carry one spelling.
func (a Addr) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText accepts every form Parse does.
func (a *Addr) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}
