package store_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/libsymm/libsymm/store"
)

// Two ranks meet through a TCP store: each publishes its metadata under its
// group's prefix and reads the other's.
func Example() {
	srv, err := store.NewServer("", "s3cret") // loopback, a free port
	if err != nil {
		panic(err)
	}
	defer srv.Close()

	ranks := make([]store.Store, 2)
	for r := range ranks {
		c, err := store.Dial(srv.Addr(), "s3cret", 5*time.Second)
		if err != nil {
			panic(err)
		}
		defer c.Close()
		ranks[r] = store.Prefix(c, "group0/")
	}

	go ranks[1].Set("meta/1", []byte("pid 4321"))
	v, err := ranks[0].Get("meta/1", 5*time.Second) // waits for rank 1
	fmt.Println(string(v), err)

	ranks[0].Add("arrived", 1)
	n, _ := ranks[1].Add("arrived", 1)
	fmt.Println("arrived:", n)

	_, err = ranks[0].Get("meta/7", 10*time.Millisecond)
	fmt.Println(err != nil && errors.Is(err, store.ErrTimeout))
	// Output:
	// pid 4321 <nil>
	// arrived: 2
	// true
}
