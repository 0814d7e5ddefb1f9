package libvirt

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/vgpu-bridge/vgpu-bridge/agent/pci"
)

// Hostdev is a vGPU-relevant host device of a domain: an mdev or a PCI
// function (a vendor-VFIO VF or a passed-through GPU).
type Hostdev struct {
	Type     string   `json:"type"`                // "mdev" | "pci"
	MdevUUID string   `json:"mdev_uuid,omitempty"` // Type "mdev"
	Addr     pci.Addr `json:"address,omitzero"`    // Type "pci"
	Model    string   `json:"model,omitempty"`     // "vfio-pci"
	Display  string   `json:"display,omitempty"`
	// Live and Config say where the device is defined: in the running
	// domain, in the persistent config, or both. For a shut-off domain only
	// Config is set.
	Live   bool `json:"live"`
	Config bool `json:"config"`
}

func (h Hostdev) key() string {
	if h.Type == "mdev" {
		return "mdev:" + h.MdevUUID
	}
	return "pci:" + h.Addr.String()
}

// Domain is a libvirt domain as the agent sees it. UUID is Nova's instance
// UUID (Nova names the domain after the instance and gives it its UUID).
type Domain struct {
	Name     string    `json:"name"`
	UUID     string    `json:"uuid"`
	State    string    `json:"state"` // running, paused, shutoff, …
	Hostdevs []Hostdev `json:"hostdevs"`
}

// Mdevs returns the mdev UUIDs among the domain's hostdevs.
func (d Domain) Mdevs() []string {
	var out []string
	for _, h := range d.Hostdevs {
		if h.Type == "mdev" {
			out = append(out, h.MdevUUID)
		}
	}
	return out
}

// Running reports whether the domain is active (running, paused, …).
func (d Domain) Running() bool { return d.State != "shutoff" && d.State != "" && d.State != "crashed" }

// ParseDomainXML reads a domain's name, UUID and mdev/PCI hostdevs.
func ParseDomainXML(s string) (Domain, error) {
	var x libvirtxml.Domain
	if err := x.Unmarshal(s); err != nil {
		return Domain{}, fmt.Errorf("parse domain xml: %w", err)
	}
	d := Domain{Name: x.Name, UUID: strings.ToLower(x.UUID), Hostdevs: []Hostdev{}}
	if x.Devices == nil {
		return d, nil
	}
	for _, h := range x.Devices.Hostdevs {
		switch {
		case h.SubsysMDev != nil:
			hd := Hostdev{Type: "mdev", Model: h.SubsysMDev.Model, Display: h.SubsysMDev.Display}
			if s := h.SubsysMDev.Source; s != nil && s.Address != nil {
				hd.MdevUUID = strings.ToLower(s.Address.UUID)
			}
			d.Hostdevs = append(d.Hostdevs, hd)
		case h.SubsysPCI != nil:
			hd := Hostdev{Type: "pci", Display: h.SubsysPCI.Display}
			if s := h.SubsysPCI.Source; s != nil && s.Address != nil {
				a := s.Address
				hd.Addr = pci.Addr{Domain: uint16(val(a.Domain)), Bus: uint8(val(a.Bus)), Slot: uint8(val(a.Slot)), Func: uint8(val(a.Function))}
			}
			if h.SubsysPCI.Driver != nil {
				hd.Model = h.SubsysPCI.Driver.Name
			}
			d.Hostdevs = append(d.Hostdevs, hd)
		}
	}
	return d, nil
}

func val(p *uint) uint {
	if p == nil {
		return 0
	}
	return *p
}

// MdevHostdevXML is the <hostdev> element for an mdev, as Nova writes it.
func MdevHostdevXML(mdevUUID string) string {
	return fmt.Sprintf("<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='%s'/></source></hostdev>", mdevUUID)
}

// PCIHostdevXML is the <hostdev> element for a PCI function (a vendor-VFIO VF).
func PCIHostdevXML(a pci.Addr) string {
	return fmt.Sprintf("<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x%04x' bus='0x%02x' slot='0x%02x' function='0x%x'/></source></hostdev>",
		a.Domain, a.Bus, a.Slot, a.Func)
}

// span is a byte range of one <hostdev> element in a document.
type span struct {
	start, end int64
	mdevUUID   string
	pciAddr    *pci.Addr
}

// hostdevSpans finds top-level <devices>/<hostdev> elements and the end of <devices>.
// Working on byte offsets leaves every other byte of the document untouched,
// so elements libvirtxml does not model survive a define.
func hostdevSpans(doc string) (spans []span, devicesEnd int64, err error) {
	dec := xml.NewDecoder(strings.NewReader(doc))
	devicesEnd = -1
	var stack []string
	var cur *span
	for {
		off := dec.InputOffset()
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, -1, fmt.Errorf("parse domain xml: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			stack = append(stack, t.Name.Local)
			if len(stack) == 3 && stack[0] == "domain" && stack[1] == "devices" && t.Name.Local == "hostdev" {
				cur = &span{start: off}
			}
			if cur != nil && t.Name.Local == "address" && len(stack) == 5 && stack[3] == "source" {
				var a pci.Addr
				var isPCI bool
				for _, at := range t.Attr {
					switch at.Name.Local {
					case "uuid":
						cur.mdevUUID = strings.ToLower(at.Value)
					case "domain", "bus", "slot", "function":
						var n uint64
						if _, err := fmt.Sscanf(at.Value, "0x%x", &n); err != nil {
							fmt.Sscanf(at.Value, "%d", &n)
						}
						isPCI = true
						switch at.Name.Local {
						case "domain":
							a.Domain = uint16(n)
						case "bus":
							a.Bus = uint8(n)
						case "slot":
							a.Slot = uint8(n)
						case "function":
							a.Func = uint8(n)
						}
					}
				}
				if isPCI {
					cur.pciAddr = &a
				}
			}
		case xml.EndElement:
			if len(stack) == 3 && t.Name.Local == "hostdev" && cur != nil {
				cur.end = dec.InputOffset()
				spans = append(spans, *cur)
				cur = nil
			}
			if len(stack) == 2 && t.Name.Local == "devices" {
				devicesEnd = off
			}
			stack = stack[:len(stack)-1]
		}
	}
	return spans, devicesEnd, nil
}

// AddHostdev inserts hostdevXML before </devices>. When a hostdev for the
// same mdev UUID or PCI address is already present, doc comes back unchanged
// with added false.
func AddHostdev(doc, hostdevXML string) (out string, added bool, err error) {
	want, err := hostdevKey(hostdevXML)
	if err != nil {
		return "", false, err
	}
	spans, end, err := hostdevSpans(doc)
	if err != nil {
		return "", false, err
	}
	for _, s := range spans {
		if s.key() == want {
			return doc, false, nil
		}
	}
	if end < 0 {
		// No <devices>: add one before </domain>.
		i := strings.LastIndex(doc, "</domain>")
		if i < 0 {
			return "", false, errors.New("domain xml has no </domain>")
		}
		return doc[:i] + "<devices>" + hostdevXML + "</devices>\n" + doc[i:], true, nil
	}
	return doc[:end] + "  " + hostdevXML + "\n  " + doc[end:], true, nil
}

// RemoveHostdev removes every hostdev with the same key as hostdevXML
// (mdev UUID or PCI address); removed is false when none was there.
func RemoveHostdev(doc, hostdevXML string) (out string, removed bool, err error) {
	want, err := hostdevKey(hostdevXML)
	if err != nil {
		return "", false, err
	}
	spans, _, err := hostdevSpans(doc)
	if err != nil {
		return "", false, err
	}
	var b bytes.Buffer
	last := int64(0)
	for _, s := range spans {
		if s.key() != want {
			continue
		}
		b.WriteString(doc[last:s.start])
		last = s.end
		removed = true
	}
	b.WriteString(doc[last:])
	return b.String(), removed, nil
}

func (s span) key() string {
	if s.mdevUUID != "" {
		return "mdev:" + s.mdevUUID
	}
	if s.pciAddr != nil {
		return "pci:" + s.pciAddr.String()
	}
	return ""
}

func hostdevKey(hostdevXML string) (string, error) {
	spans, _, err := hostdevSpans("<domain><devices>" + hostdevXML + "</devices></domain>")
	if err != nil {
		return "", err
	}
	if len(spans) != 1 || spans[0].key() == "" {
		return "", fmt.Errorf("not one mdev or pci hostdev: %q", hostdevXML)
	}
	return spans[0].key(), nil
}

// NodeMdevType is an mdev type a PCI node device offers.
type NodeMdevType struct {
	ID                 string `json:"id"`
	Name               string `json:"name"`
	DeviceAPI          string `json:"device_api"`
	AvailableInstances uint   `json:"available_instances"`
}

// NodeDevice is a PCI or mdev node device.
type NodeDevice struct {
	Name       string         `json:"name"` // pci_0000_3b_00_0, mdev_<uuid>_0000_3b_00_0
	Parent     string         `json:"parent,omitempty"`
	Kind       string         `json:"kind"`             // "pci" | "mdev"
	Addr       pci.Addr       `json:"address,omitzero"` // pci
	VendorID   string         `json:"vendor_id,omitempty"`
	ProductID  string         `json:"product_id,omitempty"`
	Product    string         `json:"product,omitempty"`
	MdevTypes  []NodeMdevType `json:"mdev_types,omitempty"` // pci
	MdevType   string         `json:"mdev_type,omitempty"`  // mdev
	MdevUUID   string         `json:"mdev_uuid,omitempty"`  // mdev
	ParentAddr pci.Addr       `json:"parent_address,omitzero"`
}

// ParseNodeDeviceXML reads a PCI or mdev node device; ok is false for other kinds.
func ParseNodeDeviceXML(s string) (NodeDevice, bool, error) {
	var x libvirtxml.NodeDevice
	if err := x.Unmarshal(s); err != nil {
		return NodeDevice{}, false, fmt.Errorf("parse node device xml: %w", err)
	}
	n := NodeDevice{Name: x.Name, Parent: x.Parent}
	if p, err := pci.Parse(x.Parent); err == nil {
		n.ParentAddr = p
	}
	switch c := x.Capability; {
	case c.PCI != nil:
		n.Kind = "pci"
		n.Addr = pci.Addr{Domain: uint16(val(c.PCI.Domain)), Bus: uint8(val(c.PCI.Bus)), Slot: uint8(val(c.PCI.Slot)), Func: uint8(val(c.PCI.Function))}
		n.VendorID, n.ProductID, n.Product = c.PCI.Vendor.ID, c.PCI.Product.ID, c.PCI.Product.Name
		for _, sc := range c.PCI.Capabilities {
			if sc.MDevTypes == nil {
				continue
			}
			for _, t := range sc.MDevTypes.Types {
				n.MdevTypes = append(n.MdevTypes, NodeMdevType{ID: t.ID, Name: t.Name, DeviceAPI: t.DeviceAPI, AvailableInstances: t.AvailableInstances})
			}
		}
	case c.MDev != nil:
		n.Kind = "mdev"
		if c.MDev.Type != nil {
			n.MdevType = c.MDev.Type.ID
		}
		n.MdevUUID = strings.ToLower(c.MDev.UUID)
		if n.MdevUUID == "" {
			n.MdevUUID = mdevUUIDFromName(x.Name)
		}
	default:
		return n, false, nil
	}
	return n, true, nil
}

// mdevUUIDFromName reads the UUID out of "mdev_<uuid_with_underscores>[_<parent>]".
func mdevUUIDFromName(name string) string {
	rest, ok := strings.CutPrefix(name, "mdev_")
	if !ok || len(rest) < 36 {
		return ""
	}
	u := strings.ReplaceAll(rest[:36], "_", "-")
	if u[8] != '-' || u[13] != '-' || u[18] != '-' || u[23] != '-' {
		return ""
	}
	return strings.ToLower(u)
}
