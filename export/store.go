package main

/*
#include <stdint.h>
#include "../include/symm.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/libsymm/libsymm/internal/settings"
	"github.com/libsymm/libsymm/store"
	"github.com/libsymm/libsymm/symmetric"
)

// The store a group's ranks meet through (symm_store_*): a server and its
// clients, held in a handle table like every other C-visible object.

//export goStoreServer
func goStoreServer(addr, token *C.char, out *C.int64_t, bound *C.char, boundLen C.size_t) (code C.int) {
	defer guard("symm_store_server", &code)
	tok := storeToken(token)
	srv, err := store.NewServer(C.GoString(addr), tok)
	if err != nil {
		return failStore("symm_store_server", err)
	}
	cl, err := store.Dial(srv.Addr(), tok, 10*time.Second)
	if err != nil {
		srv.Close()
		return fail("symm_store_server", err)
	}
	*out = C.int64_t(stores.put(&storeEntry{s: cl, server: srv}))
	if bound != nil && boundLen > 0 {
		dst := cBytes(unsafe.Pointer(bound), boundLen, len(srv.Addr())+1)
		n := copy(dst[:len(dst)-1], srv.Addr())
		dst[n] = 0
	}
	return C.SYMM_OK
}

//export goStoreConnect
func goStoreConnect(addr, token *C.char, timeoutMS C.int, out *C.int64_t) (code C.int) {
	defer guard("symm_store_connect", &code)
	cl, err := store.Dial(C.GoString(addr), storeToken(token), ms(timeoutMS))
	if err != nil {
		return failStore("symm_store_connect", err)
	}
	*out = C.int64_t(stores.put(&storeEntry{s: cl}))
	return C.SYMM_OK
}

//export goStoreSet
func goStoreSet(s C.int64_t, key *C.char, val unsafe.Pointer, n C.size_t) (code C.int) {
	defer guard("symm_store_set", &code)
	if uint64(n) > 1<<31-1 { // C.GoBytes takes a C int: a larger length would wrap
		return fail("symm_store_set", fmt.Errorf("%w: value of %d bytes: too large for the store", symmetric.ErrInvalid, uint64(n)))
	}
	e, err := stores.get(int64(s))
	if err == nil {
		err = e.s.Set(C.GoString(key), C.GoBytes(val, C.int(n)))
	}
	if err != nil {
		return failStore("symm_store_set", err)
	}
	return C.SYMM_OK
}

//export goStoreGet
func goStoreGet(s C.int64_t, key *C.char, buf unsafe.Pointer, capacity C.size_t, n *C.size_t, timeoutMS C.int) (code C.int) {
	defer guard("symm_store_get", &code)
	e, err := stores.get(int64(s))
	var v []byte
	if err == nil {
		v, err = e.s.Get(C.GoString(key), ms(timeoutMS))
	}
	if err != nil {
		return failStore("symm_store_get", err)
	}
	*n = C.size_t(len(v))
	if capacity > 0 {
		copy(cBytes(buf, capacity, len(v)), v)
	}
	return C.SYMM_OK
}

//export goStoreAdd
func goStoreAdd(s C.int64_t, key *C.char, delta C.int64_t, out *C.int64_t) (code C.int) {
	defer guard("symm_store_add", &code)
	e, err := stores.get(int64(s))
	var v int64
	if err == nil {
		v, err = e.s.Add(C.GoString(key), int64(delta))
	}
	if err != nil {
		return failStore("symm_store_add", err)
	}
	if out != nil {
		*out = C.int64_t(v)
	}
	return C.SYMM_OK
}

//export goStoreClose
func goStoreClose(s C.int64_t) (code C.int) {
	defer guard("symm_store_close", &code)
	e, err := stores.take(int64(s))
	if err != nil {
		return fail("symm_store_close", err)
	}
	if m := madeManager(); m != nil {
		m.CloseStore(e.s) // the mailboxes of the groups joined through it
	}
	err = e.s.Close()
	if e.server != nil {
		err = errors.Join(err, e.server.Close())
	}
	if err != nil {
		return fail("symm_store_close", err)
	}
	return C.SYMM_OK
}

// storeToken is the token given, or SYMM_STORE_TOKEN when none is.
func storeToken(token *C.char) string {
	if t := C.GoString(token); t != "" {
		return t
	}
	return settings.StoreToken.Get(getenv)
}
