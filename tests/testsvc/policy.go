package testsvc

import "strings"

// Rules of DirectPolicy, to add to its base.
const (
	// RuleReleaseOnRequest releases on a GPU_RELEASE webhook.
	RuleReleaseOnRequest = `  - name: release-on-request
    on: [webhook.GPU_RELEASE]
    then: ['release()']
`
	// RuleResizeOnRequest moves the instance's vGPUs to the requested
	// profile.
	RuleResizeOnRequest = `  - name: resize-on-request
    on: [webhook.GPU_RESIZE]
    then: ['resize(event.profile)']
`
	// RuleReleaseOnDelete releases a deleted instance's vGPUs.
	RuleReleaseOnDelete = `  - name: release-on-delete
    on: [nova.instance.delete.end]
    when: instance.vgpu_count > 0
    then: ['release()']
`
)

// DirectPolicy is the tests' policy for the direct path: a GPU_REQUEST
// attaches its preferred profile (direct-live), or is rejected when no
// profile fits; rules (RuleReleaseOnRequest, RuleReleaseOnDelete) follow.
func DirectPolicy(rules ...string) string {
	return attachPolicy("direct-live") + `  - name: request-without-fit
    on: [webhook.GPU_REQUEST]
    when: preferred == ""
    then: ['reject("no vGPU profile fits this request")']
` + strings.Join(rules, "")
}

// NovaPolicy is the tests' policy for the Nova-native path: a GPU_REQUEST
// attaches its preferred profile by a resize through Nova (nova-resize);
// rules (RuleReleaseOnRequest, RuleResizeOnRequest, …) follow.
func NovaPolicy(rules ...string) string {
	return attachPolicy("nova-resize") + strings.Join(rules, "")
}

// attachPolicy is a policy with the attach mode and the rule that
// attaches a GPU_REQUEST's preferred profile.
func attachPolicy(mode string) string {
	return `version: 1
defaults:
  attach_mode: ` + mode + `
  quota: {max_vgpus: 64, max_vgpus_per_vm: 4}
rules:
  - name: attach-on-request
    on: [webhook.GPU_REQUEST]
    when: preferred != ""
    then: ['attach(preferred, event.count > 0 ? event.count : 1)']
`
}
