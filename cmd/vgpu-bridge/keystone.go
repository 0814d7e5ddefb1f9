package main

import (
	"fmt"
	"net/http"
	"os"
	"text/tabwriter"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystonereg"
	"github.com/vgpu-bridge/vgpu-bridge/internal/osclient"
)

func newKeystoneCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "keystone",
		Short: "Keystone's catalog: register the bridge's service and endpoints",
	}
	var cloud, region, public, internal, admin string
	reg := &cobra.Command{
		Use:   "register --public-url URL",
		Short: "Register the service (type vgpu) and its endpoints in Keystone; safe to run again",
		Long: "Creates the service of type vgpu (name vgpu-bridge) unless one exists, and one endpoint per given " +
			"interface in the region, updating an endpoint whose URL differs; it never deletes. It logs in with an " +
			"admin's clouds.yaml entry: --os-cloud, else OS_CLOUD, else [openstack] cloud of the configuration. " +
			"The region defaults to the cloud's region_name. vgpuctl --os-cloud then finds the bridge in the catalog.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if public == "" {
				return usageError{Err: fmt.Errorf("--public-url is required")}
			}
			if cloud == "" {
				cloud = os.Getenv("OS_CLOUD")
			}
			if cloud == "" {
				v, err := g.Load()
				if err != nil {
					return err
				}
				cloud = bridge.OpenStackCloud(v)
			}
			if cloud == "" {
				return usageError{Err: fmt.Errorf("no cloud to log in with: set --os-cloud, OS_CLOUD or [openstack] cloud")}
			}
			var cloudRegion string
			identity, err := osclient.New(cmd.Context(), osclient.Config{Cloud: cloud, Type: "identity", HTTPClient: &http.Client{},
				FromCatalog: func(pc *gophercloud.ProviderClient, eo gophercloud.EndpointOpts) (*gophercloud.ServiceClient, error) {
					cloudRegion = eo.Region
					return openstack.NewIdentityV3(pc, eo)
				}})
			if err != nil {
				return fmt.Errorf("cloud %s: %w", cloud, err)
			}
			if region == "" {
				region = cloudRegion
			}
			urls := map[string]string{"public": public}
			if internal != "" {
				urls["internal"] = internal
			}
			if admin != "" {
				urls["admin"] = admin
			}
			changes, err := keystonereg.Register(cmd.Context(), identity, keystonereg.Options{Region: region, URLs: urls})
			tw := tabwriter.NewWriter(g.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "WHAT\tACTION\tID\tURL")
			for _, ch := range changes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", ch.What, ch.Action, ch.ID, ch.URL)
			}
			if ferr := tw.Flush(); err == nil {
				err = ferr
			}
			return err
		},
	}
	f := reg.Flags()
	f.StringVar(&cloud, "os-cloud", "", "admin's cloud of clouds.yaml (default OS_CLOUD, then [openstack] cloud)")
	f.StringVar(&region, "region", "", "region of the endpoints (default the cloud's region_name)")
	f.StringVar(&public, "public-url", "", "public endpoint, e.g. https://vgpu.example.org:9797")
	f.StringVar(&internal, "internal-url", "", "internal endpoint (optional)")
	f.StringVar(&admin, "admin-url", "", "admin endpoint (optional)")
	c.AddCommand(reg)
	return c
}
