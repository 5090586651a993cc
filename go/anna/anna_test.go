package anna

import (
	"errors"
	"testing"
	"time"
)

// Policies agentbox cannot honour are refused by name before anything is created.
func TestSupportedNamesTheFieldItCannotHonour(t *testing.T) {
	f := &Agentbox{}
	for field, p := range map[string]Policy{
		"Network":        {Network: "wifi"},
		"AllowedHosts":   {Network: NetworkAllowlist, AllowedHosts: []string{"example.com"}},
		"ReadOnlyPaths":  {ReadOnlyPaths: []string{"src"}},
		"WorkingDir":     {WorkingDir: "../up"},
		"FilesystemRoot": {FilesystemRoot: "relative"},
		"Env":            {Env: map[string]string{"1X": "y"}},
		"Timeout":        {Timeout: -time.Second},
	} {
		err := f.Supported(p)
		var pe *PolicyCompatibilityError
		if !errors.As(err, &pe) || pe.Field != field || pe.Backend != "agentbox" {
			t.Errorf("%s: %v", field, err)
		}
	}
	for _, p := range []Policy{{}, {Network: NetworkNone, WorkingDir: "src", Env: map[string]string{"A": "b"}, Timeout: time.Minute}, {FilesystemRoot: "/work", WorkingDir: "/work/x"}} {
		if err := f.Supported(p); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	if f.Name() != "agentbox" {
		t.Fatal(f.Name())
	}
}

// The contract's default is no outbound network; an address allowlist maps to the sandbox's.
func TestNetworkModesMapToTheSandboxsEgress(t *testing.T) {
	for mode, want := range map[NetworkMode]string{"": "None", NetworkNone: "None", NetworkFull: "All"} {
		if got := network(Policy{Network: mode}); got.Egress != want || len(got.Allow) != 0 {
			t.Errorf("%q: %+v", mode, got)
		}
	}
	got := network(Policy{Network: NetworkAllowlist, AllowedHosts: []string{"10.1.2.3", "192.0.2.0/24", "fd00::1"}})
	cidrs := []string{}
	for _, a := range got.Allow {
		cidrs = append(cidrs, a.CIDR)
	}
	if got.Egress != "Allowlist" || len(cidrs) != 3 || cidrs[0] != "10.1.2.3/32" || cidrs[1] != "192.0.2.0/24" || cidrs[2] != "fd00::1/128" {
		t.Fatalf("%+v", got)
	}
	if err := (&Agentbox{}).Supported(Policy{Network: NetworkAllowlist}); err == nil {
		t.Fatal("an allowlist without entries")
	}
}
