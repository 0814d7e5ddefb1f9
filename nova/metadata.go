package nova

import "regexp"

// GuestDriverKey is the server metadata key through which a tenant or an
// operator declares the NVIDIA driver installed in the guest, before the
// guest has booted far enough for the agent to see it:
//
//	openstack server set --property vgpu_bridge:guest_driver=550.54.15 VM
const GuestDriverKey = "vgpu_bridge:guest_driver"

// driverVersion is an NVIDIA driver version: 550, 550.54 or 550.54.15.
var driverVersion = regexp.MustCompile(`^[0-9]{1,4}(\.[0-9]{1,4}){0,3}$`)

// DeclaredGuestDriver is the guest driver version declared under
// GuestDriverKey. known is false when the payload carries no metadata at
// all (an older payload: keep what is known); v is "" when the key is
// absent or its value is not a driver version.
func (in *Instance) DeclaredGuestDriver() (v string, known bool) {
	if in.Metadata == nil {
		return "", false
	}
	s, _ := in.Metadata[GuestDriverKey].(string)
	if !driverVersion.MatchString(s) {
		return "", true
	}
	return s, true
}
