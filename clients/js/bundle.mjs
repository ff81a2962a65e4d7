// The library as one minified script for the waiting-room page, which chalicelib/page.py serves from a copy committed
// in chalicelib/static/ (test/bundle.test.mjs keeps the two equal; no CDN): an IIFE that sets `VirtualQueue`
// (WaitingLine, QueueError, ...). Prints its size, minified and gzipped.
import { build } from "esbuild";
import { readFileSync } from "node:fs";
import { gzipSync } from "node:zlib";

const outfile = "dist/page/virtual-queue.min.js";
await build({
  entryPoints: ["src/index.ts"],
  outfile,
  bundle: true,
  minify: true,
  format: "iife",
  globalName: "VirtualQueue",
  target: "es2020",
  legalComments: "none",
});
const code = readFileSync(outfile);
console.log(`${outfile}: ${code.length} bytes minified, ${gzipSync(code, { level: 9 }).length} gzipped`);
