package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/spf13/cobra"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/apiclient"
	"github.com/vgpu-bridge/vgpu-bridge/internal/osclient"
	"github.com/vgpu-bridge/vgpu-bridge/nova"
	"github.com/vgpu-bridge/vgpu-bridge/nova/computeapi"
)

func flavorCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "flavor",
		Short: "Plan and create the Nova flavors that carry vGPUs",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(flavorPlanCmd(g))
	return cmd
}

const flavorPlanLong = `Propose a vGPU flavor for each Nova flavor without vGPU and each vGPU profile
the fleet's GPUs are typed for (GET /v1/profiles: GPUS > 0), and with --apply
create the missing ones through Nova.

The flavor proposed for BASE and PROFILE is BASE.vgpu-PROFILE (lower case:
m1.small and T4-4Q give m1.small.vgpu-t4-4q, the name the bridge suggests when a
resize finds no vGPU flavor): BASE's vCPUs, RAM, disk, ephemeral, swap,
visibility and extra specs, plus, in request group 1, resources1:VGPU=1,
trait1:CUSTOM_NVIDIA_<type>=required (the trait of the profile's type, which the
GPU providers typed for it carry in Placement), so that Nova's scheduler can
only place it on a GPU of that type, and
trait1:CUSTOM_VGPU_BRIDGE_GPU_FAULT=forbidden, so that it keeps off a GPU the
bridge marked faulted (until vgpuctl undrain gpu). Flavors that ask for a vGPU already, and
flavors with malformed extra specs (reported on stderr), are not bases.

With --driver-branch N (a guest driver release branch, e.g. 550) the plan is
for guests with a driver of that branch: each flavor is named
BASE.vgpu-PROFILE-rN (m1.small.vgpu-t4-4q-r550, beside the flavor without a
branch) and also asks, in request group 1,
trait1:CUSTOM_VGPU_GUEST_DRIVER_RN=required, a trait the bridge keeps on the
GPU providers whose host's vGPU manager serves that branch ([placement]
add_driver_traits = true; without it no host has the trait and every server
of such a flavor ends NoValidHost). Use them rather than an image property
trait:CUSTOM_VGPU_GUEST_DRIVER_RN=required: Nova puts an image's traits in the
unnumbered request group, where the GPU provider of request group 1 does not
count. Profiles planned as alias flavors are left out with --driver-branch (a
PCI request carries no trait).

A profile whose GPUs are Nova-owned VFs ([placement] nova_vf_resource_classes)
gets no resources:VGPU flavor; with --alias PROFILE=ALIAS (the [pci] alias
vgpuctl host layout printed) it gets alias flavors instead: BASE's contents
plus pci_passthrough:alias=ALIAS:1, planned for bases that ask for no PCI
device yet. A profile with both Nova's mdev GPUs and Nova-owned VFs keeps its
resources:VGPU flavors only (one name cannot be both).

ACTION says what each proposal needs:
  create    no flavor has the name, nor the same contents: --apply creates it
  exists    a flavor of the name has the planned contents
  covered   no flavor has the name, but an equal one exists (or is created by
            this plan) under another name, which DETAIL names
  conflict  a flavor of the name has other contents; it is left alone and DETAIL
            says what differs
With --apply, create rows show created (or failed, with Nova's answer). Each
flavor is created, then given its extra specs; when the extra specs fail, the
flavor is deleted again, so no half-made flavor remains. Running it again is
safe: the flavors it created then show exists. Sizes, visibility and extra
specs are compared; a private base's flavor is private too, and project access
is not copied (openstack flavor set --project).

Nova is reached through the Keystone catalog of --os-cloud (service type
compute; --compute-url overrides the catalog's URL), or without Keystone with
--compute-url and --compute-token (a noauth Nova). Listing every flavor with its
extra specs (compute microversion 2.61) and creating flavors take an admin.
--flavor and --profile narrow the plan; with --profile, profiles no GPU is
typed for yet can be planned too.

-o json and -o yaml print {"proposals": [...], "skipped": [...]}: each proposal
with its flavor (name, sizes, is_public, extra_specs), based_on, profile,
trait, driver_branch (with --driver-branch), action, existing, existing_id, differences and detail; skipped lists the
flavors and profiles left out, with the reason.

Exit codes: 0 also when the plan has conflicts; 1 when a flavor could not be
created or Nova answered with an error; 2 for bad flags (a --driver-branch
that is not 1 to 9999 among them) or an unknown --profile; 4 when the bridge or Nova cannot be reached.`

const flavorPlanExample = `  # What is missing, for the m1 flavors and every profile the fleet is typed for:
  vgpuctl --os-cloud admin flavor plan --flavor 'm1.*'
  FLAVOR                BASED ON   PROFILE  ACTION    DETAIL
  m1.large.vgpu-t4-4q   m1.large   T4-4Q    conflict  left alone: extra spec resources1:VGPU missing; …
  m1.medium.vgpu-t4-4q  m1.medium  T4-4Q    create    vcpus=4 ram=4096 disk=40 + resources1:VGPU=1 trait1:CUSTOM_NVIDIA_232=required trait1:CUSTOM_VGPU_BRIDGE_GPU_FAULT=forbidden
  m1.medium.vgpu-t4-8q  m1.medium  T4-8Q    covered   equal to gpu.medium (id 5)
  m1.small.vgpu-t4-4q   m1.small   T4-4Q    exists    id 4

  # Create the missing ones (create rows then show created), for T4-4Q only:
  vgpuctl --os-cloud admin flavor plan --flavor 'm1.*' --profile T4-4Q --apply

  # Flavors for guests with a 550 driver, on hosts whose vGPU manager serves it
  # ([placement] add_driver_traits = true):
  vgpuctl --os-cloud admin flavor plan --flavor 'm1.*' --driver-branch 550 --apply
  FLAVOR                     BASED ON   PROFILE  ACTION   DETAIL
  m1.medium.vgpu-t4-4q-r550  m1.medium  T4-4Q    created  id 7
  …

  # A Nova without Keystone (noauth2), the bridge at its default URL:
  VGPUCTL_COMPUTE_TOKEN=admin:admin vgpuctl flavor plan --compute-url http://127.0.0.1:8774/v2.1 -o json`

// flavorMicroversion lists flavors with their extra specs (2.61) and
// takes a flavor description (2.55).
const flavorMicroversion = computeapi.MinMicroversion

type flavorPlanOpts struct {
	apply        bool
	profiles     []string
	patterns     []string
	aliases      []string // PROFILE=ALIAS: the Nova PCI alias of a profile's Nova-owned VFs
	driverBranch string   // the guest driver branch the flavors require ("" none)
	computeURL   string
	computeToken string
}

func flavorPlanCmd(g *globals) *cobra.Command {
	var o flavorPlanOpts
	cmd := &cobra.Command{
		Use:     "plan",
		Short:   "Propose (and with --apply create) a vGPU flavor per flavor and profile",
		Long:    flavorPlanLong,
		Example: flavorPlanExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return flavorPlan(cmd.Context(), g, o)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&o.apply, "apply", false, "create the proposals whose action is create")
	fl.StringSliceVar(&o.profiles, "profile", nil, "only these profiles, e.g. T4-4Q (repeat or comma-separate; default: every profile with GPUs typed for it)")
	fl.StringSliceVar(&o.aliases, "alias", nil, "PROFILE=ALIAS: plan alias flavors (pci_passthrough:alias=ALIAS:1) for a profile whose GPUs are Nova-owned VFs, ALIAS being the [pci] alias vgpuctl host layout printed, e.g. H200X-35C=h200x-35c (repeat or comma-separate)")
	fl.StringSliceVar(&o.patterns, "flavor", nil, "only base flavors whose name matches one of these shell patterns, e.g. 'm1.*' (repeat or comma-separate)")
	fl.StringVar(&o.driverBranch, "driver-branch", "", "plan flavors for guests with a driver of this release branch, e.g. 550: named BASE.vgpu-PROFILE-r550, requiring trait1:CUSTOM_VGPU_GUEST_DRIVER_R550 ([placement] add_driver_traits puts it on the GPUs that serve it)")
	fl.StringVar(&o.computeURL, "compute-url", "", "Nova's compute API URL, e.g. http://127.0.0.1:8774/v2.1 (default: the catalog's, after a Keystone login: --os-cloud or OS_* variables)")
	fl.StringVar(&o.computeToken, "compute-token", "", "token for --compute-url without Keystone (env VGPUCTL_COMPUTE_TOKEN; prefer the environment)")
	return cmd
}

func flavorPlan(ctx context.Context, g *globals, o flavorPlanOpts) error {
	for _, p := range o.patterns {
		if _, err := path.Match(p, ""); err != nil {
			return usageErr(fmt.Errorf("--flavor %q: %w", p, err))
		}
	}
	branch, err := parseDriverBranch(o.driverBranch)
	if err != nil {
		return usageErr(err)
	}
	if o.computeToken == "" {
		o.computeToken = os.Getenv("VGPUCTL_COMPUTE_TOKEN")
	}
	if o.computeToken != "" && o.computeURL == "" {
		return usageErr(errors.New("--compute-token needs --compute-url"))
	}
	_, _, keystone := g.keystone()
	if o.computeURL == "" && o.computeToken == "" && !keystone {
		return usageErr(errors.New("how to reach Nova: give --os-cloud or OS_* variables (Keystone's catalog), or --compute-url with --compute-token"))
	}
	if o.computeURL != "" && o.computeToken == "" && !keystone {
		return usageErr(errors.New("--compute-url needs --compute-token, or --os-cloud or OS_* variables for a Keystone token"))
	}

	aliases := map[string]string{}
	for _, a := range o.aliases {
		prof, alias, ok := strings.Cut(a, "=")
		if !ok || prof == "" || alias == "" || strings.ContainsAny(alias, ":, ") {
			return usageErr(fmt.Errorf("--alias %q: want PROFILE=ALIAS, an alias name without ':', ',' or space", a))
		}
		aliases[strings.ToUpper(prof)] = alias
	}
	profiles, err := planProfiles(ctx, g, o.profiles, aliases)
	if err != nil {
		return err
	}
	if branch != 0 {
		for i := range profiles {
			profiles[i].DriverBranch = branch
		}
	}
	sc, err := computeClient(ctx, g, o)
	if err != nil {
		return err
	}
	all, err := listFlavors(ctx, sc)
	if err != nil {
		return err
	}
	plan := nova.PlanFlavors(all, profiles, func(f nova.PlanFlavor) bool { return matchAny(o.patterns, f.Name) })
	for _, s := range plan.Skipped {
		if !s.VGPU {
			what := "flavor " + s.Flavor
			switch {
			case s.Flavor != "" && s.Profile != "":
				what += " for " + s.Profile
			case s.Flavor == "":
				what = "profile " + s.Profile
			}
			fmt.Fprintf(g.stderr, "vgpuctl: %s left out: %s\n", what, s.Reason)
		}
	}
	if len(profiles) == 0 {
		fmt.Fprintln(g.stderr, "vgpuctl: no GPU of the fleet is typed for a profile yet (vgpuctl profiles); name one with --profile")
	}

	failed := 0
	if o.apply {
		for i := range plan.Proposals {
			p := &plan.Proposals[i]
			if p.Action != nova.PlanCreate {
				continue
			}
			id, err := createFlavor(ctx, sc, p)
			if err != nil {
				failed++
				p.Action, p.Detail = nova.PlanFailed, err.Error()
				if apiErr := asUnreachable(err); apiErr != nil {
					// Nova went away: the rest would fail the same way.
					_ = g.emitPlan(plan)
					return apiErr
				}
				continue
			}
			p.Action, p.Existing, p.ExistingID, p.Detail = nova.PlanCreated, p.Flavor.Name, id, "id "+id
		}
		// Rows covered by a flavor this run made (or failed to make).
		made := map[string]nova.FlavorProposal{}
		for _, p := range plan.Proposals {
			if p.Action == nova.PlanCreated || p.Action == nova.PlanFailed {
				made[p.Flavor.Name] = p
			}
		}
		for i := range plan.Proposals {
			p := &plan.Proposals[i]
			if c, ok := made[p.Existing]; ok && p.Action == nova.PlanCovered && p.ExistingID == "" {
				if c.Action == nova.PlanCreated {
					p.ExistingID, p.Detail = c.ExistingID, "equal to "+c.Flavor.Name+" (id "+c.ExistingID+"), created now"
				} else {
					p.Detail = "equal to " + c.Flavor.Name + ", which could not be created: run again"
				}
			}
		}
	}
	if err := g.emitPlan(plan); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d flavor(s) could not be created (ACTION failed)", failed)
	}
	return nil
}

func (g *globals) emitPlan(plan nova.FlavorPlan) error {
	raw, err := json.Marshal(plan)
	if err != nil {
		return err
	}
	return g.emit(raw, func(w io.Writer) {
		header(w, "FLAVOR", "BASED ON", "PROFILE", "ACTION", "DETAIL")
		for _, p := range plan.Proposals {
			row(w, p.Flavor.Name, p.BasedOn, p.Profile, string(p.Action), clip(p.Detail, 160))
		}
	})
}

// parseDriverBranch reads --driver-branch: "" is none (0), else a
// release branch of 1 to 4 digits without a leading zero ("550"; "0",
// "r550" and "550.54.15" are refused, naming the form wanted).
func parseDriverBranch(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	n := 0
	ok := len(s) <= 4 && s[0] != '0'
	for _, c := range s {
		if c < '0' || c > '9' {
			ok = false
			break
		}
		n = n*10 + int(c-'0')
	}
	if !ok || n < 1 || n > nova.MaxDriverBranch {
		return 0, fmt.Errorf("--driver-branch %q: want a guest driver release branch, a number of 1 to %d such as 550 (the major version of 550.54.15)", s, nova.MaxDriverBranch)
	}
	return n, nil
}

// cloudName is --os-cloud, else $OS_CLOUD.
func (g *globals) cloudName() string {
	if g.cloud != "" {
		return g.cloud
	}
	return os.Getenv("OS_CLOUD")
}

func matchAny(patterns []string, name string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// planProfiles reads the catalog from the bridge: the profiles named, or
// (none named) those the fleet's GPUs are typed for. A profile given an
// alias (by upper-case name) is planned as alias flavors when its GPUs
// are Nova-owned VFs.
func planProfiles(ctx context.Context, g *globals, names []string, aliases map[string]string) ([]nova.PlanProfile, error) {
	pl, err := g.api().Profiles(ctx, "", "")
	if err != nil {
		return nil, err
	}
	var out []nova.PlanProfile
	if len(names) == 0 {
		for _, p := range pl.Profiles {
			if p.GPUs > 0 && p.BridgeOwned > 0 {
				fmt.Fprintf(g.stderr, "vgpuctl: profile %s: %d of its %d GPUs are bridge-owned (resource class %s): "+
					"Nova's resources:VGPU flavors never reach them, only the bridge's direct path does\n", p.Name, p.BridgeOwned, p.GPUs, apiclient.BridgeOwnedClass)
			}
			alias := aliases[strings.ToUpper(p.Name)]
			switch {
			case p.GPUs > 0 && p.NovaVF > 0 && alias != "" && p.GPUs-p.BridgeOwned-p.NovaVF > 0:
				fmt.Fprintf(g.stderr, "vgpuctl: profile %s: %d of its %d GPUs are Nova-owned VFs and others are Nova's mdev GPUs: "+
					"one flavor name cannot be both; its alias flavor is not planned\n", p.Name, p.NovaVF, p.GPUs)
			case p.GPUs > 0 && p.NovaVF > 0 && alias != "":
				out = append(out, nova.PlanProfile{Name: p.Name, TypeID: p.TypeID, Alias: alias})
			case p.GPUs > 0 && p.NovaVF > 0:
				fmt.Fprintf(g.stderr, "vgpuctl: profile %s: %d of its %d GPUs are Nova-owned VFs: a flavor reaches them with "+
					"pci_passthrough:alias (vgpuctl host layout prints it; --alias %s=NAME plans it), not resources:VGPU\n", p.Name, p.NovaVF, p.GPUs, p.Name)
			}
			if p.GPUs-p.BridgeOwned-p.NovaVF > 0 && p.Trait != "" {
				out = append(out, nova.PlanProfile{Name: p.Name, TypeID: p.TypeID, Trait: p.Trait})
			}
		}
		return out, nil
	}
	for _, n := range names {
		found := false
		for _, p := range pl.Profiles {
			if strings.EqualFold(p.Name, n) {
				found = true
				if alias := aliases[strings.ToUpper(p.Name)]; alias != "" {
					out = append(out, nova.PlanProfile{Name: p.Name, TypeID: p.TypeID, Alias: alias})
					break
				}
				if p.Trait == "" {
					return nil, fmt.Errorf("profile %s: its type id is not known yet (no agent has reported it, and the profile catalog names none), so it has no trait", p.Name)
				}
				out = append(out, nova.PlanProfile{Name: p.Name, TypeID: p.TypeID, Trait: p.Trait})
				break
			}
		}
		if !found {
			return nil, usageErr(fmt.Errorf("--profile %s: not in the bridge's profile catalog (vgpuctl profiles lists it)", n))
		}
	}
	return out, nil
}

// computeClient is Nova's compute client: --compute-url with
// --compute-token, or a Keystone login with the cloud of clouds.yaml
// (the catalog's compute URL unless --compute-url overrides it).
func computeClient(ctx context.Context, g *globals, o flavorPlanOpts) (*gophercloud.ServiceClient, error) {
	hc := &http.Client{Timeout: g.timeout}
	if g.cacert != "" {
		var err error
		if hc, err = caClient(g.cacert, g.timeout); err != nil {
			return nil, err
		}
	}
	cfg := osclient.Config{Endpoint: o.computeURL, Token: o.computeToken, Type: "compute", FromCatalog: openstack.NewComputeV2,
		HTTPClient: hc, Microversion: flavorMicroversion}
	if o.computeToken != "" {
		return cfg.Static(), nil
	}
	what, parse, _ := g.keystone()
	c, err := parse()
	if err != nil {
		return nil, err
	}
	pc, err := c.Login(ctx, *hc)
	if err != nil {
		err = fmt.Errorf("%s: Keystone login at %s: %w", what, c.Auth.IdentityEndpoint, err)
		if u := asUnreachable(err); u != nil {
			return nil, u
		}
		return nil, err
	}
	sc, err := cfg.Service(pc, c.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return sc, nil
}

// listFlavors lists every flavor, public and private, with extra specs.
func listFlavors(ctx context.Context, sc *gophercloud.ServiceClient) ([]nova.PlanFlavor, error) {
	pages, err := flavors.ListDetail(sc, flavors.ListOpts{AccessType: flavors.AllAccess}).AllPages(ctx)
	if err != nil {
		return nil, novaErr("list flavors", sc, err)
	}
	fs, err := flavors.ExtractFlavors(pages)
	if err != nil {
		return nil, fmt.Errorf("nova: list flavors: %w", err)
	}
	out := make([]nova.PlanFlavor, 0, len(fs))
	for _, f := range fs {
		out = append(out, nova.PlanFlavor{ID: f.ID, Name: f.Name, VCPUs: f.VCPUs, RAM: f.RAM, Disk: f.Disk, Ephemeral: f.Ephemeral,
			Swap: f.Swap, Public: f.IsPublic, ExtraSpecs: f.ExtraSpecs})
	}
	return out, nil
}

// createFlavor creates p's flavor and then its extra specs; when the
// extra specs fail it deletes the flavor again. It returns the new id.
func createFlavor(ctx context.Context, sc *gophercloud.ServiceClient, p *nova.FlavorProposal) (string, error) {
	f := p.Flavor
	disk, eph, swap, public := f.Disk, f.Ephemeral, f.Swap, f.Public
	opts := flavors.CreateOpts{Name: f.Name, VCPUs: f.VCPUs, RAM: f.RAM, Disk: &disk, Ephemeral: &eph, IsPublic: &public,
		Description: fmt.Sprintf("%s with one %s vGPU (vgpuctl flavor plan)", p.BasedOn, p.Profile)}
	if p.DriverBranch != 0 {
		opts.Description = fmt.Sprintf("%s with one %s vGPU for a %d guest driver (vgpuctl flavor plan)", p.BasedOn, p.Profile, p.DriverBranch)
	}
	if swap > 0 {
		opts.Swap = &swap
	}
	created, err := flavors.Create(ctx, sc, opts).Extract()
	if err != nil {
		return "", novaErr("create flavor "+f.Name, sc, err)
	}
	if created == nil || created.ID == "" {
		return "", fmt.Errorf("nova: create flavor %s: the answer holds no flavor id", f.Name)
	}
	if _, err := flavors.CreateExtraSpecs(ctx, sc, created.ID, flavors.ExtraSpecsOpts(f.ExtraSpecs)).Extract(); err != nil {
		err = novaErr("set the extra specs of flavor "+f.Name, sc, err)
		// A context that ended must not keep the half-made flavor.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := flavors.Delete(dctx, sc, created.ID).ExtractErr(); derr != nil {
			return "", fmt.Errorf("%w; deleting flavor %s (id %s) again failed too, delete it by hand: %v", err, f.Name, created.ID, novaErr("delete", sc, derr))
		}
		return "", fmt.Errorf("%w (flavor deleted again)", err)
	}
	return created.ID, nil
}

// novaErr names the call and Nova's answer; a network failure becomes
// exit 4 (the API could not be reached).
func novaErr(op string, sc *gophercloud.ServiceClient, err error) error {
	var code gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &code) {
		body := strings.TrimSpace(string(code.Body))
		var fault map[string]struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(code.Body, &fault) == nil {
			for _, v := range fault {
				if v.Message != "" {
					body = v.Message
				}
			}
		}
		return fmt.Errorf("nova: %s: %d %s", op, code.Actual, clip(body, 300))
	}
	e := fmt.Errorf("nova: %s at %s: %w", op, sc.Endpoint, err)
	if u := asUnreachable(e); u != nil {
		return u
	}
	return e
}

// asUnreachable returns err as exit 4 when it is a network failure
// (connection refused, DNS, timeout), nil otherwise.
func asUnreachable(err error) error {
	var ee exitError
	if errors.As(err, &ee) {
		if ee.code == exitNoAPI {
			return ee
		}
		return nil
	}
	var ue *url.Error
	var ne net.Error
	if errors.As(err, &ue) || errors.As(err, &ne) {
		return exitError{exitNoAPI, err}
	}
	return nil
}
