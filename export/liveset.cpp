#include "liveset.h"

#include <stdlib.h>
#include <string.h>

#include "front.h"

namespace front {

Stripe g_stripes[kStripes];

namespace {

void put(Stripe &s, const Rec &rec);

// rehash moves s's records into nt (ncap slots, zeroed, allocated by the
// caller outside the lock) and returns the old table for the caller to free
// once the lock is released. Called with s.lk held.
Rec *rehash(Stripe &s, Rec *nt, uint32_t ncap) {
  Rec *old = s.tab;
  uint32_t ocap = s.cap;
  s.tab = nt;
  s.cap = ncap;
  s.n = 0;
  for (uint32_t i = 0; i < ocap; i++)
    if (old[i].state != kEmpty) put(s, old[i]);
  return old;
}

void put(Stripe &s, const Rec &rec) {
  for (uint32_t i = home(s, rec.ptr);; i = (i + 1) & (s.cap - 1)) {
    if (s.tab[i].state == kEmpty) {
      s.tab[i] = rec;
      s.n++;
      return;
    }
  }
}

}  // namespace

// erase removes r by backward-shift deletion, so no tombstones build up.
void erase(Stripe &s, Rec *r) {
  uint32_t i = (uint32_t)(r - s.tab), mask = s.cap - 1;
  for (uint32_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    if (s.tab[j].state == kEmpty) break;
    uint32_t h = home(s, s.tab[j].ptr);
    // Move j back to i if its home is not in the cyclic range (i, j].
    if (((j - h) & mask) >= ((j - i) & mask)) {
      s.tab[i] = s.tab[j];
      i = j;
    }
  }
  s.tab[i].state = kEmpty;
  s.n--;
}

void record(const Rec &rec) {
  Stripe &s = stripe_of(rec.ptr);
  Rec *spare = nullptr, *old = nullptr;
  uint32_t spare_cap = 0;
  for (;;) {
    uint32_t need;
    {
      Guard g(s.lk);
      if (Rec *r = find(s, rec.ptr)) erase(s, r);  // a stale record: the pool is the authority
      if (2 * (s.n + 1) > s.cap && spare != nullptr && spare_cap > s.cap) {
        old = rehash(s, spare, spare_cap);
        spare = nullptr;
      }
      if (2 * (s.n + 1) <= s.cap) {
        put(s, rec);
        break;
      }
      need = s.cap ? s.cap * 2 : 64;
    }
    // The table must grow: allocate with no lock held, then try again
    // (another thread may have grown it meanwhile).
    ::free(spare);
    spare = static_cast<Rec *>(calloc(need, sizeof(Rec)));
    spare_cap = need;
    if (spare == nullptr) return;  // no memory: this block just bypasses the cache
  }
  ::free(spare);
  ::free(old);
}

void forget(uintptr_t ptr) {
  Stripe &s = stripe_of(ptr);
  Guard g(s.lk);
  if (Rec *r = find(s, ptr)) erase(s, r);
}

void mark_record_stream(uintptr_t base) {
  Stripe &s = stripe_of(base);
  Guard g(s.lk);
  if (Rec *r = find(s, base)) r->rs = 1;
}

void forget_all() {
  for (Stripe &s : g_stripes) {
    Guard g(s.lk);
    if (s.n == 0) continue;
    memset(s.tab, 0, s.cap * sizeof(Rec));  // every state kEmpty
    s.n = 0;
  }
}

}  // namespace front
