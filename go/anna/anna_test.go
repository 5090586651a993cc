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
		"Network":        {Network: NetworkAllowlist},
		"AllowedHosts":   {AllowedHosts: []string{"example.com"}},
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
