package allocator

import (
	"fmt"
	"slices"
	"sync/atomic"
)

// Routes: which allocations a private pool's open routings take.
//
// Each BeginAllocateToPool opens one routing of a device to a private pool,
// with a Route that picks the allocations it takes (a CUDA graph's capture
// stream, a thread inside torch.cuda.use_mem_pool); EndAllocateToPool, or
// the pool's last release, closes it. device.routes is the one record of
// them, newest last: RouteOf asks the newest first, as PyTorch's get_pool
// asks its captures_underway.
//
// Three views of it, each kept by the code that changes it, under privMu:
//   - device.routes itself, the routes with their pools;
//   - device.capture (gate.go): how many are open on the device, read
//     without a lock by operations that must not run during a capture;
//   - Pool.routes: how many are open on all devices, in memory outside the
//     Go heap (OpenRoutes), so that a caller in C tests one word before it
//     asks RouteOf, and never calls into Go to route while none is open.

// A Route picks the allocations an open routing takes.
type Route interface {
	// Takes reports whether an allocation on stream goes to the routing's
	// pool. An error fails the allocation. It is called with the device's
	// privMu held, so it must not call into the pool.
	Takes(stream uintptr) (bool, error)
	// Close is called once, when the routing ends, with no lock of the pool
	// held.
	Close()
}

// StreamRoute takes the allocations made on one stream (the C API's
// symm_pool_begin_allocate_to_pool).
type StreamRoute uintptr

func (r StreamRoute) Takes(stream uintptr) (bool, error) { return uintptr(r) == stream, nil }
func (StreamRoute) Close()                               {}

// openRouting is one open routing of a device: its pool and its Route
// (nil: it takes nothing by itself; AllocIn names the pool).
type openRouting struct {
	pool  *privatePool
	route Route
}

// openRoute opens a routing of pool pp with route r. Called with privMu
// held; the caller drains the gate once privMu is unlocked.
func (d *device) openRoute(pp *privatePool, r Route) {
	d.routes = append(d.routes, openRouting{pool: pp, route: r})
	d.capture.begin()
}

// closeRoute ends the newest open routing of pp and returns its Route for
// the caller to close once privMu is unlocked; false if none is open.
// Called with privMu held.
func (d *device) closeRoute(pp *privatePool) (Route, bool) {
	for i := len(d.routes) - 1; i >= 0; i-- {
		if d.routes[i].pool != pp {
			continue
		}
		r := d.routes[i].route
		d.routes = slices.Delete(d.routes, i, i+1) // zeroes the vacated slot
		d.capture.end(1)
		return r, true
	}
	return nil, false
}

// routings counts the open routings of pp. Called with privMu held.
func (d *device) routings(pp *privatePool) int {
	n := 0
	for _, o := range d.routes {
		if o.pool == pp {
			n++
		}
	}
	return n
}

// closeRoutes closes the routes a routing's end handed back.
func closeRoutes(rs ...Route) {
	for _, r := range rs {
		if r != nil {
			r.Close()
		}
	}
}

// RouteOf returns the private pool that an allocation on stream of device
// dev goes to: that of the newest open routing whose Route takes it. ok is
// false when none does (or dev is not a device: the allocation's own call
// reports that); err is a Route's failure, which fails the allocation.
func (p *Pool) RouteOf(dev int, stream uintptr) (id PoolID, ok bool, err error) {
	if dev < 0 || dev >= len(p.devs) {
		return PoolID{}, false, nil
	}
	d := p.devs[dev]
	if !d.capture.routing() {
		return PoolID{}, false, nil
	}
	d.privMu.Lock()
	defer d.privMu.Unlock()
	for i := len(d.routes) - 1; i >= 0; i-- {
		o := d.routes[i]
		if o.route == nil {
			continue
		}
		takes, err := o.route.Takes(stream)
		if err != nil {
			return o.pool.id, false, fmt.Errorf("the routing to private pool %v on device %d: %w", o.pool.id, dev, err)
		}
		if takes {
			return o.pool.id, true, nil
		}
	}
	return PoolID{}, false, nil
}

// OpenRoutes is the number of routings open on all devices: memory outside
// the Go heap, valid for the process's life, which a caller in C may keep
// and read atomically (zero: RouteOf would find no route, and need not be
// asked). It may read above zero for an instant after the last routing
// closed, never zero while one is open.
func (p *Pool) OpenRoutes() *atomic.Uint64 { return p.routes }
