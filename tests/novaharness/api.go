package novaharness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"

	"github.com/vgpu-bridge/vgpu-bridge/internal/osclient"
	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// ImageID is the image servers boot from: GlanceFixture's image1, which
// every Nova process of the harness serves in-process.
const ImageID = "155d900f-4e14-4e4c-a73d-069cbf4541e6"

// Microversion is the compute API microversion the helpers use (2.74:
// create a server on a named host).
const Microversion = "2.74"

// placementVersion is the Placement microversion of the helpers (1.39:
// consumer types).
const placementVersion = "placement 1.39"

// APIError is a non-2xx answer of Nova or Placement.
type APIError struct {
	Method, URL string
	Status      int
	Body        string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s %s: %d %s", e.Method, e.URL, e.Status, strings.TrimSpace(e.Body))
}

// IsNotFound tells whether err is a 404 answer.
func IsNotFound(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

var httpClient = &http.Client{Timeout: 60 * time.Second}

func doJSON(ctx context.Context, method, u string, hdr http.Header, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	req.Header = hdr.Clone()
	// The test Placement (uwsgi --http-socket) closes every connection
	// after its answer; a reused one would be reset.
	req.Close = true
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &APIError{Method: method, URL: u, Status: resp.StatusCode, Body: string(b)}
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, u, err)
		}
	}
	return nil
}

// do calls the compute API (path below /v2.1).
func (n *Nova) do(ctx context.Context, method, path string, in, out any) error {
	return n.ComputeAs(ctx, method, path, n.Token(), in, out)
}

// ComputeAs calls the compute API (path below /v2.1) with a noauth2
// token ("user:project", e.g. to act in a project of the test's own) and
// decodes the JSON answer into out; a non-2xx answer is an *APIError.
func (n *Nova) ComputeAs(ctx context.Context, method, path, token string, in, out any) error {
	h := http.Header{}
	h.Set("X-Auth-Token", token)
	h.Set("X-OpenStack-Nova-API-Version", Microversion)
	return doJSON(ctx, method, n.api+path, h, in, out)
}

// PlacementCall calls Placement as admin (path below its root).
func (n *Nova) PlacementCall(ctx context.Context, method, path string, in, out any) error {
	return n.placementDo(ctx, method, path, in, out)
}

// placementDo calls Placement.
func (n *Nova) placementDo(ctx context.Context, method, path string, in, out any) error {
	h := http.Header{}
	h.Set("X-Auth-Token", "admin")
	h.Set("OpenStack-API-Version", placementVersion)
	return doJSON(ctx, method, n.placement+path, h, in, out)
}

func testCtx(t testing.TB) (context.Context, context.CancelFunc) {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			return context.WithDeadline(context.Background(), dl)
		}
	}
	return context.WithTimeout(context.Background(), 10*time.Minute)
}

// ComputeClient is a gophercloud client of the compute API with the
// harness's token and Microversion.
func (n *Nova) ComputeClient(t testing.TB) *gophercloud.ServiceClient {
	t.Helper()
	return osclient.Config{Endpoint: n.api, Token: n.Token(), Type: "compute", Microversion: Microversion,
		HTTPClient: &http.Client{}}.Static()
}

// CreateFlavor creates a public flavor with extraSpecs and returns its id.
func (n *Nova) CreateFlavor(t testing.TB, name string, vcpus, ramMB, diskGB int, extraSpecs map[string]string) string {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	var out struct {
		Flavor struct{ ID string } `json:"flavor"`
	}
	err := n.do(ctx, http.MethodPost, "/flavors", map[string]any{"flavor": map[string]any{
		"name": name, "vcpus": vcpus, "ram": ramMB, "disk": diskGB, "id": uuid.NewString()}}, &out)
	if err != nil {
		t.Fatalf("create flavor %s: %v", name, err)
	}
	if len(extraSpecs) > 0 {
		if err := n.do(ctx, http.MethodPost, "/flavors/"+out.Flavor.ID+"/os-extra_specs",
			map[string]any{"extra_specs": extraSpecs}, nil); err != nil {
			t.Fatalf("extra specs of flavor %s: %v", name, err)
		}
	}
	return out.Flavor.ID
}

// CreateServer boots a server of flavorID from ImageID without networks,
// on host when it is not empty, and returns its id without waiting.
func (n *Nova) CreateServer(t testing.TB, name, flavorID, host string) string {
	t.Helper()
	return n.CreateServerFrom(t, name, flavorID, ImageID, host)
}

// CreateServerFrom is CreateServer from another image (Options.ImagesFile).
func (n *Nova) CreateServerFrom(t testing.TB, name, flavorID, imageID, host string) string {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	s := map[string]any{"name": name, "flavorRef": flavorID, "imageRef": imageID, "networks": "none"}
	if host != "" {
		s["host"] = host
	}
	var out struct {
		Server struct{ ID string } `json:"server"`
	}
	if err := n.do(ctx, http.MethodPost, "/servers", map[string]any{"server": s}, &out); err != nil {
		t.Fatalf("create server %s: %v", name, err)
	}
	return out.Server.ID
}

// Server is what the tests read of a Nova server.
type Server struct {
	ID, Name, Status string
	TaskState        string // OS-EXT-STS:task_state
	VMState          string // OS-EXT-STS:vm_state
	Host             string // OS-EXT-SRV-ATTR:host
	InstanceName     string // OS-EXT-SRV-ATTR:instance_name, the libvirt domain's name
	Flavor           Flavor
	Fault            string // fault.message, when there is one
}

// Flavor is a server's embedded flavor (microversion ≥ 2.47).
type Flavor struct {
	OriginalName string            `json:"original_name"`
	VCPUs        int               `json:"vcpus"`
	RAM          int               `json:"ram"`
	Disk         int               `json:"disk"`
	ExtraSpecs   map[string]string `json:"extra_specs"`
}

// GetServer returns a server; IsNotFound(err) once it is deleted.
func (n *Nova) GetServer(ctx context.Context, id string) (Server, error) {
	var out struct {
		Server struct {
			ID, Name, Status string
			TaskState        *string `json:"OS-EXT-STS:task_state"`
			VMState          string  `json:"OS-EXT-STS:vm_state"`
			Host             *string `json:"OS-EXT-SRV-ATTR:host"`
			InstanceName     string  `json:"OS-EXT-SRV-ATTR:instance_name"`
			Flavor           Flavor  `json:"flavor"`
			Fault            *struct {
				Message string `json:"message"`
			} `json:"fault"`
		} `json:"server"`
	}
	if err := n.do(ctx, http.MethodGet, "/servers/"+url.PathEscape(id), nil, &out); err != nil {
		return Server{}, err
	}
	s := out.Server
	r := Server{ID: s.ID, Name: s.Name, Status: s.Status, VMState: s.VMState, InstanceName: s.InstanceName, Flavor: s.Flavor}
	if s.TaskState != nil {
		r.TaskState = *s.TaskState
	}
	if s.Host != nil {
		r.Host = *s.Host
	}
	if s.Fault != nil {
		r.Fault = s.Fault.Message
	}
	return r, nil
}

// Server returns a server, failing the test when Nova does not answer.
func (n *Nova) Server(t testing.TB, id string) Server {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	s, err := n.GetServer(ctx, id)
	if err != nil {
		t.Fatalf("server %s: %v", id, err)
	}
	return s
}

// WaitServer waits (2 min at most) until the server has status with no
// task running, and returns it. A server going to ERROR fails the test
// at once, with Nova's fault, unless status is ERROR.
func (n *Nova) WaitServer(t testing.TB, id, status string) Server {
	t.Helper()
	return n.WaitServerWithin(t, id, status, 2*time.Minute)
}

// WaitServerWithin is WaitServer waiting up to within (a compute in the
// lab VM runs emulated).
func (n *Nova) WaitServerWithin(t testing.TB, id, status string, within time.Duration) Server {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	deadline := time.Now().Add(within)
	for {
		s, err := n.GetServer(ctx, id)
		if err != nil {
			t.Fatalf("server %s: %v", id, err)
		}
		if s.Status == status && s.TaskState == "" {
			return s
		}
		if s.Status == "ERROR" && status != "ERROR" {
			t.Fatalf("server %s went to ERROR waiting for %s: %s", id, status, s.Fault)
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %s is %s (task %q), not %s, after %s", id, s.Status, s.TaskState, status, within)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// DeleteServer deletes a server and waits (2 min at most) until Nova no
// longer knows it.
func (n *Nova) DeleteServer(t testing.TB, id string) {
	t.Helper()
	n.DeleteServerWithin(t, id, 2*time.Minute)
}

// DeleteServerWithin is DeleteServer waiting up to within.
func (n *Nova) DeleteServerWithin(t testing.TB, id string, within time.Duration) {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	if err := n.do(ctx, http.MethodDelete, "/servers/"+url.PathEscape(id), nil, nil); err != nil && !IsNotFound(err) {
		t.Fatalf("delete server %s: %v", id, err)
	}
	deadline := time.Now().Add(within)
	for {
		s, err := n.GetServer(ctx, id)
		if IsNotFound(err) {
			return
		}
		if err != nil {
			t.Fatalf("server %s: %v", id, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %s still %s (task %q) %s after delete", id, s.Status, s.TaskState, within)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type provider struct {
	UUID       string `json:"uuid"`
	Name       string `json:"name"`
	Generation int    `json:"generation"`
	Parent     string `json:"parent_provider_uuid"`
	Root       string `json:"root_provider_uuid"`
}

func (n *Nova) providerByName(ctx context.Context, name string) (provider, error) {
	var out struct {
		ResourceProviders []provider `json:"resource_providers"`
	}
	if err := n.placementDo(ctx, http.MethodGet, "/resource_providers?name="+url.QueryEscape(name), nil, &out); err != nil {
		return provider{}, err
	}
	if len(out.ResourceProviders) == 0 {
		return provider{}, fmt.Errorf("no resource provider named %s", name)
	}
	return out.ResourceProviders[0], nil
}

// ComputeNodeProvider is the uuid of the host's compute node provider.
func (n *Nova) ComputeNodeProvider(t testing.TB, host string) string {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	p, err := n.providerByName(ctx, host)
	if err != nil {
		t.Fatalf("compute node provider of %s: %v", host, err)
	}
	return p.UUID
}

// vgpuChild is a GPU child provider AddVGPUChild created.
type vgpuChild struct {
	host, pci, typeID string
}

// TypeOfTrait maps a CUSTOM_NVIDIA_<n> trait to its mdev type nvidia-<n>.
func TypeOfTrait(trait string) (string, error) {
	num, ok := strings.CutPrefix(trait, "CUSTOM_NVIDIA_")
	if !ok || num == "" {
		return "", fmt.Errorf("trait %s does not name an NVIDIA vGPU type (CUSTOM_NVIDIA_<n>)", trait)
	}
	return "nvidia-" + strings.ToLower(num), nil
}

// AddVGPUChild adds, as Nova's libvirt driver does for each physical GPU
// with [devices] enabled_mdev_types, a child provider
// <host>_pci_<addr with _> under the host's compute node with total VGPU
// and the trait (CUSTOM_NVIDIA_232 for mdev type nvidia-232). pciAddr
// must be an mdev GPU of the fake host (0000:3b:00.0 or 0000:d8:00.0).
func (n *Nova) AddVGPUChild(t testing.TB, host, pciAddr, trait string, total int) string {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	typ, err := TypeOfTrait(trait)
	if err != nil {
		t.Fatal(err)
	}
	fh := n.FakeHost(host)
	if fh == nil {
		t.Fatalf("AddVGPUChild: %s is not a compute host of this Nova (%v)", host, n.Hosts())
	}
	if !fh.hasType(pciAddr, typ) {
		t.Fatalf("AddVGPUChild: the fake host %s has no GPU %s with mdev type %s", host, pciAddr, typ)
	}
	root := n.ComputeNodeProvider(t, host)
	id := uuid.NewString()
	name := testsvc.GPUProviderName(host, pciAddr)
	var p provider
	if err := n.placementDo(ctx, http.MethodPost, "/resource_providers",
		map[string]any{"name": name, "uuid": id, "parent_provider_uuid": root}, &p); err != nil {
		t.Fatalf("create provider %s: %v", name, err)
	}
	n.mu.Lock()
	n.providers = append(n.providers, id)
	n.children[id] = vgpuChild{host: host, pci: pciAddr, typeID: typ}
	n.mu.Unlock()
	var inv struct {
		Generation int `json:"resource_provider_generation"`
	}
	if err := n.placementDo(ctx, http.MethodPut, "/resource_providers/"+id+"/inventories", map[string]any{
		"resource_provider_generation": p.Generation,
		"inventories":                  map[string]any{"VGPU": map[string]any{"total": total, "max_unit": total}}}, &inv); err != nil {
		t.Fatalf("VGPU inventory of %s: %v", name, err)
	}
	if err := n.placementDo(ctx, http.MethodPut, "/traits/"+trait, nil, nil); err != nil {
		t.Fatalf("trait %s: %v", trait, err)
	}
	if err := n.placementDo(ctx, http.MethodPut, "/resource_providers/"+id+"/traits", map[string]any{
		"resource_provider_generation": inv.Generation, "traits": []string{trait}}, nil); err != nil {
		t.Fatalf("traits of %s: %v", name, err)
	}
	return id
}

// Allocations returns a consumer's Placement allocations: provider uuid
// → resource class → amount (empty when it has none).
func (n *Nova) Allocations(t testing.TB, consumer string) map[string]map[string]int {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	a, err := n.allocations(ctx, consumer)
	if err != nil {
		t.Fatalf("allocations of %s: %v", consumer, err)
	}
	return a
}

func (n *Nova) allocations(ctx context.Context, consumer string) (map[string]map[string]int, error) {
	var out struct {
		Allocations map[string]struct {
			Resources map[string]int `json:"resources"`
		} `json:"allocations"`
	}
	if err := n.placementDo(ctx, http.MethodGet, "/allocations/"+url.PathEscape(consumer), nil, &out); err != nil {
		return nil, err
	}
	res := map[string]map[string]int{}
	for rp, a := range out.Allocations {
		res[rp] = a.Resources
	}
	return res, nil
}

// Usages returns a provider's usages: resource class → amount used.
func (n *Nova) Usages(t testing.TB, provider string) map[string]int {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	var out struct {
		Usages map[string]int `json:"usages"`
	}
	if err := n.placementDo(ctx, http.MethodGet, "/resource_providers/"+url.PathEscape(provider)+"/usages", nil, &out); err != nil {
		t.Fatalf("usages of %s: %v", provider, err)
	}
	return out.Usages
}

// sweepPlacement removes the providers (and their allocations) of runs
// whose test process is gone: root providers named <prefix>-nt<pid>x<hex>
// and their children.
func sweepPlacement(ctx context.Context, placementURL string, dead func(pid int) bool) {
	n := &Nova{placement: placementURL}
	var out struct {
		ResourceProviders []provider `json:"resource_providers"`
	}
	if err := n.placementDo(ctx, http.MethodGet, "/resource_providers", nil, &out); err != nil {
		return
	}
	for _, p := range out.ResourceProviders {
		if p.Parent != "" {
			continue
		}
		m := runName.FindStringSubmatch(p.Name)
		if m == nil {
			continue
		}
		if pid, err := strconv.Atoi(m[1]); err != nil || !dead(pid) {
			continue
		}
		n.hosts = append(n.hosts, p.Name)
	}
	if len(n.hosts) > 0 {
		_ = n.cleanupPlacement(ctx)
	}
}

// runName matches the unique suffix of a run's host names.
var runName = regexp.MustCompile(`-nt([0-9]+)x[0-9a-f]{6}$`)

// cleanupPlacement removes the run's providers (the GPU children, then
// each host's compute node) after deleting every allocation against them.
func (n *Nova) cleanupPlacement(ctx context.Context) error {
	n.mu.Lock()
	children, hosts := slices.Clone(n.providers), slices.Clone(n.hosts)
	n.mu.Unlock()
	return n.removeTrees(ctx, hosts, children)
}

// removeTrees deletes the provider trees of hosts (compute node providers
// named so, and every provider in their trees) and the providers in
// children, with every allocation against them.
func (n *Nova) removeTrees(ctx context.Context, hosts, children []string) error {
	var roots []string
	for _, h := range hosts {
		if p, err := n.providerByName(ctx, h); err == nil {
			roots = append(roots, p.UUID)
			// Children Nova or a test made that the harness does not know.
			var out struct {
				ResourceProviders []provider `json:"resource_providers"`
			}
			if err := n.placementDo(ctx, http.MethodGet, "/resource_providers?in_tree="+p.UUID, nil, &out); err == nil {
				for _, c := range out.ResourceProviders {
					if c.UUID != p.UUID && !slices.Contains(children, c.UUID) {
						children = append(children, c.UUID)
					}
				}
			}
		}
	}
	var errs []error
	for _, rp := range append(children, roots...) {
		var out struct {
			Allocations map[string]any `json:"allocations"`
		}
		if err := n.placementDo(ctx, http.MethodGet, "/resource_providers/"+rp+"/allocations", nil, &out); err != nil {
			if !IsNotFound(err) {
				errs = append(errs, err)
			}
			continue
		}
		for consumer := range out.Allocations {
			if err := n.placementDo(ctx, http.MethodDelete, "/allocations/"+consumer, nil, nil); err != nil && !IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	for _, rp := range append(children, roots...) {
		if err := n.placementDo(ctx, http.MethodDelete, "/resource_providers/"+rp, nil, nil); err != nil && !IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// LiveMigrate asks Nova to live-migrate a server to host (os-migrateLive,
// block_migration auto; host "" lets the scheduler choose). It returns as
// soon as Nova accepted the request; WaitServer follows it.
func (n *Nova) LiveMigrate(t testing.TB, id, host string) {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	var h any
	if host != "" {
		h = host
	}
	body := map[string]any{"os-migrateLive": map[string]any{"host": h, "block_migration": "auto"}}
	if err := n.do(ctx, http.MethodPost, "/servers/"+url.PathEscape(id)+"/action", body, nil); err != nil {
		t.Fatalf("live-migrate server %s to %q: %v", id, host, err)
	}
}

// InstanceActions counts Nova's record of a server's actions by name
// (create, resize, confirmResize, revertResize, migrate…): what Nova was
// asked, whoever asked.
func (n *Nova) InstanceActions(t testing.TB, server string) map[string]int {
	t.Helper()
	ctx, cancel := testCtx(t)
	defer cancel()
	var out struct {
		Actions []struct {
			Action string `json:"action"`
		} `json:"instanceActions"`
	}
	if err := n.do(ctx, http.MethodGet, "/servers/"+url.PathEscape(server)+"/os-instance-actions", nil, &out); err != nil {
		t.Fatalf("instance actions of %s: %v", server, err)
	}
	counts := map[string]int{}
	for _, a := range out.Actions {
		counts[a.Action]++
	}
	return counts
}
