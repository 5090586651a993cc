package agentbox

import (
	"encoding/json"
	"testing"
)

// A domain entry's credential is on the wire as the CRD has it (camelCase, the header left out
// when it is the default), and decodes back.
func TestEgressCredentialWireForm(t *testing.T) {
	n := NetworkSpec{Egress: "Allowlist", Allow: []EgressAllow{
		{Domain: "api.example.com", Ports: []EgressPort{{Port: 443}},
			Credential: &EgressCredential{SecretName: "model-key", Key: "token"}},
		{Domain: "pypi.org"},
	}}
	b, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"egress":"Allowlist","allow":[{"domain":"api.example.com","ports":[{"port":443}],"credential":{"secretName":"model-key","key":"token"}},{"domain":"pypi.org"}]}`
	if string(b) != want {
		t.Fatalf("got %s\nwant %s", b, want)
	}
	var back NetworkSpec
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Allow[0].Credential == nil || back.Allow[0].Credential.SecretName != "model-key" || back.Allow[1].Credential != nil {
		t.Fatalf("decoded %+v", back)
	}
}
