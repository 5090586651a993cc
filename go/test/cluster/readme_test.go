package cluster

import (
	"context"
	"fmt"
)

// The README's Go (README.md, "From Go", and go/README.md), run here against the cluster:
// go test compares what it prints with the Output below.
func Example_turn() {
	if err := turn(context.Background(), sandboxes); err != nil {
		fmt.Println(err)
	}
	// Output:
	// 3
	// ship it
}
