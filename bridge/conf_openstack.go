package bridge

import (
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var (
	optOpenStackCloud = openstackOptions.String("openstack", "cloud", "",
		"The entry of clouds.yaml (searched in ./clouds.yaml, ~/.config/openstack/, /etc/openstack/, "+
			"or $OS_CLIENT_CONFIG_FILE) whose Keystone credentials reach Placement and Nova. Leave empty only when "+
			"[placement] endpoint_override and token_file are both set (noauth2 labs). Example: vgpu-bridge")
)

// openstackOptions are the options declared in this file; Options assembles them
// into the daemon's set.
var openstackOptions = conf.NewGroup().
	SectionHelp("openstack", "OpenStack credentials, from clouds.yaml.")

// checkOpenStackCloud is checked by the features that call OpenStack (not
// by every command: `migrate` needs no credentials).
func checkOpenStackCloud(v *conf.Values) error {
	if optOpenStackCloud.Get(v) == "" && (optPlacementEndpoint.Get(v) == "" || optPlacementTokenFile.Get(v) == "") {
		return conf.Errors{{Section: "openstack", Option: "cloud",
			Problem: "is required unless [placement] endpoint_override and token_file are both set; allowed: a clouds.yaml entry name"}}
	}
	return nil
}

// OpenStackCloud returns [openstack] cloud.
func OpenStackCloud(v *conf.Values) string { return optOpenStackCloud.Get(v) }
