// The page's bundle (`npm run bundle`, which `make test-js` runs before these tests): one script that sets
// VirtualQueue, at most 8 KB minified and gzipped, and the very bytes the waiting room serves (docs/clients.md).
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { test } from "node:test";
import { runInNewContext } from "node:vm";
import { gzipSync } from "node:zlib";

const BUNDLE = new URL("../dist/page/virtual-queue.min.js", import.meta.url);

test("the page's bundle is one script of at most 8 KB gzipped that sets VirtualQueue", { skip: !existsSync(BUNDLE) && "no bundle: npm run bundle" }, () => {
  const code = readFileSync(BUNDLE);
  assert.ok(gzipSync(code, { level: 9 }).length <= 8 * 1024, `${gzipSync(code, { level: 9 }).length} bytes gzipped`);
  const page = {};
  runInNewContext(code.toString(), page);
  assert.equal(typeof page.VirtualQueue.WaitingLine, "function");
  assert.equal(typeof page.VirtualQueue.memoryStorage, "function");
  assert.ok(page.VirtualQueue.QUEUE_ERROR_CODES.includes("QUEUE_FULL"));
});

// The waiting room runs on a copy committed in chalicelib/static/ (`make run` needs no Node): it must be this build.
test("the waiting room's copy of the bundle is a fresh npm run bundle, byte for byte", { skip: !existsSync(BUNDLE) && "no bundle: npm run bundle" }, () => {
  const served = readFileSync(new URL("../../../chalicelib/static/virtual-queue.min.js", import.meta.url));
  assert.ok(readFileSync(BUNDLE).equals(served), "chalicelib/static/virtual-queue.min.js differs: cp clients/js/dist/page/virtual-queue.min.js chalicelib/static/");
});
