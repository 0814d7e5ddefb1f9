package bridge

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/keystoneauth"
	"github.com/vgpu-bridge/vgpu-bridge/internal/conf"
)

var (
	optKeystoneCloud = keystoneOptions.String("keystone", "cloud", "",
		"With [api] auth_strategy = keystone: the clouds.yaml entry whose credentials the bridge uses to validate "+
			"callers' tokens (the user needs Keystone's service or admin role). Empty uses auth_url and the "+
			"credentials below when auth_url is set, else [openstack] cloud. Example: vgpu-bridge")

	// The credentials of keystonemiddleware's [keystone_authtoken], for
	// a section pasted from nova.conf: the bridge validates tokens as a
	// service does, with a service user of its own.
	optKSAuthURL = keystoneOptions.String("keystone", "auth_url", "",
		"Instead of a clouds.yaml entry (cloud empty): the Keystone URL the bridge logs in at, with the "+
			"credentials of the options below, to validate callers' tokens; keystonemiddleware's options of the same "+
			"names, so [keystone_authtoken] can be pasted from nova.conf (with the bridge's own service user). "+
			"Example: https://keystone-internal.example.org:5000").
		Also("keystone_authtoken", "auth_url")
	optKSAuthType = keystoneOptions.Choice("keystone", "auth_type", "password",
		[]string{"password", "v3password", "v3applicationcredential", "applicationcredential"},
		"With auth_url: how the bridge logs in, as keystoneauth's plugin names: a password, or an application "+
			"credential. Example: v3applicationcredential").
		Also("keystone_authtoken", "auth_type")
	optKSUsername = keystoneOptions.String("keystone", "username", "",
		"With auth_url: the bridge's user. Example: vgpu-bridge").Also("keystone_authtoken", "username")
	optKSPassword = keystoneOptions.Secret("keystone", "password",
		"With auth_url: the password of username. Example: secret").Also("keystone_authtoken", "password")
	optKSUserDomainName = keystoneOptions.String("keystone", "user_domain_name", "",
		"With auth_url: the domain of username, by name. Example: Default").Also("keystone_authtoken", "user_domain_name")
	optKSUserDomainID = keystoneOptions.String("keystone", "user_domain_id", "",
		"With auth_url: the domain of username, by id. Example: default").Also("keystone_authtoken", "user_domain_id")
	optKSProjectName = keystoneOptions.String("keystone", "project_name", "",
		"With auth_url: the project the bridge's token is scoped to. Example: service").Also("keystone_authtoken", "project_name")
	optKSProjectDomainName = keystoneOptions.String("keystone", "project_domain_name", "",
		"With auth_url: the domain of project_name, by name. Example: Default").Also("keystone_authtoken", "project_domain_name")
	optKSProjectDomainID = keystoneOptions.String("keystone", "project_domain_id", "",
		"With auth_url: the domain of project_name, by id. Example: default").Also("keystone_authtoken", "project_domain_id")
	optKSAppCredID = keystoneOptions.String("keystone", "application_credential_id", "",
		"With auth_url and auth_type = v3applicationcredential: the application credential's id. Example: "+
			"21dced0fd20347869b93710d2b98aae0").Also("keystone_authtoken", "application_credential_id")
	optKSAppCredSecret = keystoneOptions.Secret("keystone", "application_credential_secret",
		"With auth_url and auth_type = v3applicationcredential: its secret. Example: secret").
		Also("keystone_authtoken", "application_credential_secret")
	optKSCAFile = keystoneOptions.String("keystone", "cafile", "",
		"With auth_url: PEM CA bundle Keystone's certificate is verified with; empty uses the system's. "+
			"Example: /etc/ssl/certs/ca-bundle.pem").Also("keystone_authtoken", "cafile")
	optKSRegionName = keystoneOptions.String("keystone", "region_name", "",
		"With auth_url: the region whose identity endpoint of the catalog validates tokens. Example: RegionOne").
		Also("keystone_authtoken", "region_name")
	optKSInterface = keystoneOptions.String("keystone", "interface", "",
		"With auth_url: the catalog's interface of that endpoint (public, internal or admin); empty: public. "+
			"Example: internal").Also("keystone_authtoken", "interface")
)

// keystoneOptions are the options declared in this file, the clouds.yaml
// entry (the rest of [keystone] is package keystoneauth's); Options
// assembles them into the daemon's set with validateKeystone.
var keystoneOptions = conf.NewGroup().
	SectionHelp("keystone", "Keystone authentication of the operator API ([api] auth_strategy = keystone).")

// validateKeystone tests relations between the options of this file.
func validateKeystone(v *conf.Values) conf.Errors {
	if optAPIAuth.Get(v) != "keystone" {
		return nil
	}
	var errs conf.Errors
	switch {
	case optKeystoneCloud.Get(v) == "" && optKSAuthURL.Get(v) != "":
		errs = append(errs, checkKeystoneCredentials(v)...)
	case keystoneCloud(v) == "":
		errs = append(errs, &conf.Error{Section: "keystone", Option: "cloud",
			Problem: "is required when [api] auth_strategy = keystone (or set auth_url and credentials, or [openstack] cloud); " +
				"allowed: a clouds.yaml entry name"})
	}
	if kc := keystoneauth.ConfigFrom(v); len(kc.AdminRoles) == 0 && len(kc.ReaderRoles) == 0 {
		errs = append(errs, &conf.Error{Section: "keystone", Option: "admin_roles",
			Problem: "admin_roles and reader_roles are both empty; allowed: Keystone role names, e.g. admin"})
	}
	return errs
}

// keystoneCredentialsName names the cloud of auth_url's credentials in
// logs and errors.
const keystoneCredentialsName = "keystone_authtoken"

// checkKeystoneCredentials tests the credentials that go with auth_url.
func checkKeystoneCredentials(v *conf.Values) conf.Errors {
	missing := func(name string) *conf.Error {
		return &conf.Error{Section: "keystone", Option: name,
			Problem: fmt.Sprintf("is required with auth_url and auth_type = %s ([keystone_authtoken] %s in nova.conf)", optKSAuthType.Get(v), name)}
	}
	var errs conf.Errors
	if strings.Contains(optKSAuthType.Get(v), "applicationcredential") {
		for _, o := range []conf.String{optKSAppCredID, optKSAppCredSecret} {
			if o.Get(v) == "" {
				errs = append(errs, missing(o.Option().Name))
			}
		}
		return errs
	}
	for _, o := range []conf.String{optKSUsername, optKSPassword} {
		if o.Get(v) == "" {
			errs = append(errs, missing(o.Option().Name))
		}
	}
	return errs
}

// keystoneCredentialsCloud is the clouds.yaml entry auth_url and its
// credentials make, named keystone_authtoken.
func keystoneCredentialsCloud(v *conf.Values) clouds.Cloud {
	a := &clouds.AuthInfo{AuthURL: optKSAuthURL.Get(v)}
	t := clouds.AuthType(optKSAuthType.Get(v))
	if strings.Contains(string(t), "applicationcredential") {
		t = clouds.AuthV3ApplicationCredential
		a.ApplicationCredentialID, a.ApplicationCredentialSecret = optKSAppCredID.Get(v), optKSAppCredSecret.Get(v)
	} else {
		a.Username, a.Password = optKSUsername.Get(v), optKSPassword.Get(v)
		a.UserDomainName, a.UserDomainID = optKSUserDomainName.Get(v), optKSUserDomainID.Get(v)
		a.ProjectName = optKSProjectName.Get(v)
		a.ProjectDomainName, a.ProjectDomainID = optKSProjectDomainName.Get(v), optKSProjectDomainID.Get(v)
	}
	return clouds.Cloud{AuthType: t, AuthInfo: a, RegionName: optKSRegionName.Get(v),
		Interface: optKSInterface.Get(v), CACertFile: optKSCAFile.Get(v)}
}

// keystoneClient is the bridge's Keystone client, logged in with the
// [keystone] credentials (cloud, auth_url and the rest), else [openstack]
// cloud's; it logs in at its first call.
func keystoneClient(v *conf.Values) (*keystoneauth.Keystone, error) {
	kc := keystoneauth.KeystoneConfig{Cloud: keystoneCloud(v), Timeout: keystoneauth.ConfigFrom(v).Timeout}
	if optKeystoneCloud.Get(v) == "" && optKSAuthURL.Get(v) != "" {
		// auth_url's credentials, read by the same clouds.yaml logic as
		// an entry of the file (JSON is YAML).
		b, err := json.Marshal(clouds.Clouds{Clouds: map[string]clouds.Cloud{keystoneCredentialsName: keystoneCredentialsCloud(v)}})
		if err != nil {
			return nil, fmt.Errorf("[keystone] credentials: %w", err)
		}
		kc.Cloud, kc.ParseOptions = keystoneCredentialsName, []clouds.ParseOption{clouds.WithCloudsYAML(bytes.NewReader(b))}
	}
	return keystoneauth.NewKeystone(kc)
}

func keystoneCloud(v *conf.Values) string {
	if c := optKeystoneCloud.Get(v); c != "" {
		return c
	}
	return optOpenStackCloud.Get(v)
}

// KeystoneAuthConfig maps [keystone] to the Authenticator's configuration
// (reading clouds.yaml, without logging in).
func KeystoneAuthConfig(v *conf.Values, log *slog.Logger) (keystoneauth.Config, error) {
	c := keystoneauth.ConfigFrom(v)
	ks, err := keystoneClient(v)
	if err != nil {
		return keystoneauth.Config{}, err
	}
	c.Validator, c.Logger = ks, log
	c.ChallengeURI = cmp.Or(c.ChallengeURI, ks.AuthURL())
	return c, nil
}
