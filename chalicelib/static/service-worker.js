// The waiting room's service worker: keeps the last copy of each waiting-room page this browser loaded, and of
// the client library they run on, and serves it when a reload cannot reach the server (down, or answering 5xx).
// The page then shows the place it last knew, marked as old, and reconnects by itself. Only page loads and the
// library come here; the API's calls never do.
const CACHE = "vq-waiting-room-1";
const LIBRARY = new URL("virtual-queue.min.js", self.registration.scope).href;  // beside this worker

// One copy per page, whatever its query (?user=, ?lang=): the page reads those from its own address.
const keyOf = (address) => { const url = new URL(address); return url.origin + url.pathname; };

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil((async () => {
  // The page that registered this worker loaded without it: keep a copy of it (and the library) now.
  const cache = await caches.open(CACHE);
  const pages = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  await Promise.all([LIBRARY, ...pages.map((page) => page.url)].map(async (address) => {
    const response = await fetch(address, { cache: "no-store" }).catch(() => null);
    if (response && response.ok) await cache.put(keyOf(address), response);
  }));
  await self.clients.claim();
})()));

self.addEventListener("fetch", (event) => {
  if (event.request.mode !== "navigate" && keyOf(event.request.url) !== LIBRARY) return;
  const key = keyOf(event.request.url);
  event.respondWith((async () => {
    const cache = await caches.open(CACHE);
    let response;
    try {
      response = await fetch(event.request);
    } catch (err) {
      const kept = await cache.match(key, { ignoreVary: true });
      if (kept) return kept;
      throw err;
    }
    if (response.ok) {
      await cache.put(key, response.clone());
    } else if (response.status >= 500) {
      const kept = await cache.match(key, { ignoreVary: true });
      if (kept) return kept;
    }
    return response;
  })());
});
