package agentbox

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// isExcerpt: block is the same lines as file at one indentation (tests/readme.rs's rule).
func isExcerpt(block, file string) bool {
	want := strings.Split(strings.TrimSuffix(block, "\n"), "\n")
	have := strings.Split(file, "\n")
	if len(want) == 0 || strings.TrimSpace(want[0]) == "" {
		return false
	}
	for i := range have {
		indent, ok := strings.CutSuffix(have[i], want[0])
		if !ok || strings.TrimSpace(indent) != "" {
			continue
		}
		all := true
		for j, w := range want {
			if i+j >= len(have) {
				all = false
				break
			}
			h := have[i+j]
			if strings.TrimSpace(w) == "" {
				all = strings.TrimSpace(h) == ""
			} else {
				rest, ok := strings.CutPrefix(h, indent)
				all = ok && rest == w
			}
			if !all {
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

var fence = regexp.MustCompile("(?ms)^(<!-- excerpt of (\\S+) -->\\n)?```(\\w*)\\n(.*?)^```\\n")

// Every block of go/README.md, and the Go of README.md, is an excerpt of a file that is
// compiled and run (go/test/cluster's Example_turn runs turn on the cluster).
func TestReadmeBlocksAreExcerptsOfTestedFiles(t *testing.T) {
	n := 0
	for _, doc := range []string{"README.md", "../README.md"} {
		raw, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fence.FindAllStringSubmatch(string(raw), -1) {
			path, lang, body := m[2], m[3], m[4]
			if doc == "../README.md" && lang != "go" {
				continue // tests/readme.rs checks the others
			}
			if lang != "go" || path == "" {
				t.Errorf("%s: a %q block that is not an excerpt of a Go file", doc, lang)
				continue
			}
			file, err := os.ReadFile("../" + path)
			if err != nil || !isExcerpt(body, string(file)) {
				t.Errorf("%s: not an excerpt of %s (%v):\n%s", doc, path, err, body)
			}
			n++
		}
	}
	if n < 1 {
		t.Fatal("no Go block found")
	}
}
