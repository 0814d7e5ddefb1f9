package osclient

import (
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
)

// TestParseEnv: the OS_* variables of openrc files, as Horizon and kolla
// write them, become the AuthOptions gophercloud logs in with.
func TestParseEnv(t *testing.T) {
	// What clouds.Parse reads from the process's environment itself.
	for _, v := range []string{"OS_CLOUD", "OS_REGION_NAME", "OS_INTERFACE", "OS_CACERT", "OS_CLIENT_CONFIG_FILE"} {
		t.Setenv(v, "")
	}
	horizon := map[string]string{"OS_AUTH_URL": "https://keystone.example:5000/v3", "OS_USERNAME": "alice", "OS_PASSWORD": "s3cret",
		"OS_PROJECT_NAME": "demo", "OS_PROJECT_ID": "", "OS_USER_DOMAIN_NAME": "Users", "OS_PROJECT_DOMAIN_ID": "default",
		"OS_REGION_NAME": "RegionTwo", "OS_INTERFACE": "internal", "OS_IDENTITY_API_VERSION": "3"}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name    string
		env     map[string]string
		want    gophercloud.AuthOptions
		wantEO  gophercloud.EndpointOpts
		wantErr string
	}{
		{name: "horizon password openrc", env: horizon,
			want: gophercloud.AuthOptions{IdentityEndpoint: "https://keystone.example:5000/v3", Username: "alice", Password: "s3cret",
				DomainName: "Users", TenantName: "demo", AllowReauth: true,
				Scope: &gophercloud.AuthScope{ProjectName: "demo", DomainID: "default"}},
			wantEO: gophercloud.EndpointOpts{Region: "RegionTwo", Availability: gophercloud.AvailabilityInternal}},
		{name: "token: the user's domain goes, the project's stays",
			env: with(horizon, "OS_AUTH_TYPE", "v3token", "OS_TOKEN", "gAAAA-tok", "OS_PASSWORD", "", "OS_INTERFACE", ""),
			want: gophercloud.AuthOptions{IdentityEndpoint: "https://keystone.example:5000/v3", TokenID: "gAAAA-tok",
				TenantName: "demo", AllowReauth: true, Scope: &gophercloud.AuthScope{ProjectName: "demo", DomainID: "default"}},
			wantEO: gophercloud.EndpointOpts{Region: "RegionTwo", Availability: gophercloud.AvailabilityPublic}},
		{name: "a token alone means token auth; OS_DOMAIN_NAME scopes the project",
			env: map[string]string{"OS_AUTH_URL": "http://k/v3", "OS_TOKEN": "t", "OS_PROJECT_NAME": "p", "OS_DOMAIN_NAME": "D"},
			want: gophercloud.AuthOptions{IdentityEndpoint: "http://k/v3", TokenID: "t", TenantName: "p", AllowReauth: true,
				Scope: &gophercloud.AuthScope{ProjectName: "p", DomainName: "D"}},
			wantEO: gophercloud.EndpointOpts{Availability: gophercloud.AvailabilityPublic}},
		{name: "application credential: no scope of its own",
			env: with(horizon, "OS_AUTH_TYPE", "v3applicationcredential", "OS_APPLICATION_CREDENTIAL_ID", "ac1",
				"OS_APPLICATION_CREDENTIAL_SECRET", "acs", "OS_PASSWORD", ""),
			want: gophercloud.AuthOptions{IdentityEndpoint: "https://keystone.example:5000/v3", ApplicationCredentialID: "ac1",
				ApplicationCredentialSecret: "acs", AllowReauth: true},
			wantEO: gophercloud.EndpointOpts{Region: "RegionTwo", Availability: gophercloud.AvailabilityInternal}},
		{name: "no password", env: with(horizon, "OS_PASSWORD", ""), wantErr: "OS_USERNAME is set but not OS_PASSWORD"},
		{name: "no user", env: map[string]string{"OS_AUTH_URL": "http://k/v3", "OS_PASSWORD": "p"}, wantErr: "neither OS_USERNAME nor OS_USER_ID"},
		{name: "token type without a token", env: with(horizon, "OS_AUTH_TYPE", "token"), wantErr: "OS_TOKEN is not set"},
		{name: "unknown auth type", env: with(horizon, "OS_AUTH_TYPE", "v3oidcpassword"), wantErr: `OS_AUTH_TYPE "v3oidcpassword"`},
		{name: "no auth url", env: with(horizon, "OS_AUTH_URL", ""), wantErr: "OS_AUTH_URL is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			c, err := ParseEnv(getenv)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Name != EnvCloudName {
				t.Errorf("name %q", c.Name)
			}
			if !equalAuth(c.Auth, tt.want) {
				t.Errorf("auth %+v (scope %+v)\nwant %+v (scope %+v)", c.Auth, c.Auth.Scope, tt.want, tt.want.Scope)
			}
			if c.Endpoint.Region != tt.wantEO.Region || c.Endpoint.Availability != tt.wantEO.Availability {
				t.Errorf("endpoint opts %+v, want %+v", c.Endpoint, tt.wantEO)
			}
		})
	}
}

func equalAuth(a, b gophercloud.AuthOptions) bool {
	as, bs := a.Scope, b.Scope
	a.Scope, b.Scope = nil, nil
	if (as == nil) != (bs == nil) || (as != nil && *as != *bs) {
		return false
	}
	return a == b
}
