// A crowd driven by the library, for the simulator (infra/sim/client_crowd.py): node crowd.mjs PLAN.json.
// The plan: {"api", "purchase", "workers", "users": [{"id", "arrivesS"}]}. The users are split over `workers`
// worker threads (the bound); each user joins at its arrival, waits as the library paces it, and buys once.
// Prints one JSON line: the outcomes and the calls the library made.
import { readFileSync } from "node:fs";
import { Worker, isMainThread, parentPort, workerData } from "node:worker_threads";

import { WaitingLine } from "../dist/index.js";

if (isMainThread) {
  const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
  const startAtMs = Date.now() + 500;
  const shares = Array.from({ length: plan.workers }, (_, w) => plan.users.filter((_, i) => i % plan.workers === w));
  const results = await Promise.all(
    shares.map(
      (users) =>
        new Promise((resolve, reject) => {
          const worker = new Worker(new URL(import.meta.url), { workerData: { ...plan, users, startAtMs } });
          worker.once("message", resolve);
          worker.once("error", reject);
        }),
    ),
  );
  const outcomes = {};
  for (const result of results) for (const [what, n] of Object.entries(result.outcomes)) outcomes[what] = (outcomes[what] ?? 0) + n;
  console.log(JSON.stringify({ outcomes, calls: results.reduce((sum, r) => sum + r.calls, 0) }));
} else {
  const { api, purchase, users, startAtMs } = workerData;
  let calls = 0;
  const counted = (url, init) => {
    calls += 1;
    return fetch(url, init);
  };
  const outcomes = {};
  const journey = async ({ id, arrivesS }) => {
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, startAtMs + arrivesS * 1000 - Date.now())));
    const line = new WaitingLine({ baseUrl: api, type: "limited-drop", targetId: 1, userId: String(id), fetch: counted, callTimeoutMs: 30_000 });
    try {
      const admitted = new Promise((resolve, reject) => {
        line.on("admitted", resolve);
        line.on("error", reject);
        line.on("update", (update) => update.state === "SOLD_OUT" && reject(new Error("SOLD_OUT")));
      });
      await line.join();
      await admitted;
      const order = await line.buy(purchase, { quantity: 1 });
      return order.status === 201 ? "bought" : `purchase ${order.status}`;
    } catch (err) {
      return err.code ?? err.message;
    } finally {
      line.stop();
    }
  };
  for (const outcome of await Promise.all(users.map(journey))) outcomes[outcome] = (outcomes[outcome] ?? 0) + 1;
  parentPort.postMessage({ outcomes, calls });
}
