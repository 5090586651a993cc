package anna

import (
	"strings"
	"testing"
	"time"
)

// Policies agentbox cannot honour are refused by name before anything is created.
func TestSupportedNamesTheFieldItCannotHonour(t *testing.T) {
	f := &Agentbox{}
	for field, p := range map[string]Policy{
		"Network.Mode":           {Network: NetworkPolicy{Mode: "allowlist"}},
		"Network.Timeout":        {Network: NetworkPolicy{Timeout: time.Second}},
		"Filesystem.Homes":       {Filesystem: FilesystemPolicy{Homes: []HomeAttachment{{HomeID: "h"}}}},
		"Filesystem.WorkingDir":  {Filesystem: FilesystemPolicy{WorkingDir: "../up"}},
		"InheritEnv":             {InheritEnv: true},
		"Env":                    {Env: map[string]string{"1X": "y"}},
		"Timeout":                {Timeout: -time.Second},
		"Filesystem.WorkingDir:": {Filesystem: FilesystemPolicy{WorkingDir: "/etc"}},
	} {
		err := f.Supported(p)
		pe, ok := err.(*PolicyCompatibilityError)
		if !ok || !strings.HasPrefix(pe.Reason, "Policy."+strings.TrimSuffix(field, ":")+": ") || pe.Backend != "agentbox" || !IsPolicyCompatibilityError(err) {
			t.Errorf("%s: %v", field, err)
		}
	}
	for _, p := range []Policy{{}, {Network: NetworkPolicy{Mode: NetworkDisabled}, Filesystem: FilesystemPolicy{WorkingDir: "src"}, Env: map[string]string{"A": "b"}, Timeout: time.Minute}, {Filesystem: FilesystemPolicy{WorkingDir: "/workspace/x"}}} {
		if err := f.Supported(p); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	if err := (&Agentbox{Root: "/work"}).Supported(Policy{Filesystem: FilesystemPolicy{WorkingDir: "/work/x"}}); err != nil {
		t.Error(err)
	}
	if err := (&Agentbox{Root: "relative"}).Supported(Policy{}); !IsPolicyCompatibilityError(err) {
		t.Errorf("relative root: %v", err)
	}
	if f.Name() != "agentbox" {
		t.Fatal(f.Name())
	}
	if (Policy{}).Validate() == nil || (Policy{Filesystem: FilesystemPolicy{WorkingDir: "/w"}}).Validate() != nil || (Policy{}).NetworkModeOrDefault() != NetworkAllowAll {
		t.Fatal("Validate / NetworkModeOrDefault")
	}
}

// The contract's network modes map to the sandbox's egress ("" is NetworkAllowAll there).
func TestNetworkModesMapToTheSandboxsEgress(t *testing.T) {
	for mode, want := range map[NetworkMode]string{"": "All", NetworkAllowAll: "All", NetworkDisabled: "None"} {
		if got := (&Agentbox{}).egress(Policy{Network: NetworkPolicy{Mode: mode}}); got != want {
			t.Errorf("%q: %s, want %s", mode, got, want)
		}
	}
}
