import { availableParallelism } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { killAllChildrenSync, startChild, type ChildHandle } from "./lib/processes.js";
import { load, percentiles, preflight, UnloadedSampler, type Target } from "./lib/measure.js";
import { baseEnv, readCommonSettings } from "./lib/settings.js";
import { createBenchDatabase, type BenchDatabase } from "./lib/setup.js";

/**
 * `npm run bench:floor`: what the issue's JSON targets leave room for on this machine. The same
 * fake upstream and reverse proxy as `npm run bench`, against three floors (bench/floor.ts): a
 * metering hop without a database, the same hop with one committed INSERT before the upstream
 * call and one UPDATE after it, and that with group commit. JSON only; unloaded p50 and throughput at load, each
 * as a ratio or difference to the proxy measured in the same run. See bench/README.md.
 */

const { serverUrl, seconds, warmupSeconds, connections, unloadedRequests } = readCommonSettings();

function log(message: string): void {
  process.stderr.write(`[bench:floor] ${message}\n`);
}

function childEnv(): NodeJS.ProcessEnv {
  return { ...baseEnv(), HOST: "127.0.0.1", PORT: "0" };
}

interface Row {
  readonly name: string;
  readonly p50Ms: number;
  readonly requestsPerSecond: number;
  readonly cpuMsPerRequest: number;
  readonly bad: number;
}

async function main(): Promise<number> {
  const children: ChildHandle[] = [];
  let db: BenchDatabase | undefined;
  const watchdog = setTimeout(
    () => {
      log("the run overstayed its budget: stopping");
      killAllChildrenSync();
      process.exit(3);
    },
    120_000 + 4 * (warmupSeconds + seconds + 5) * 1000,
  );
  process.on("exit", killAllChildrenSync);
  try {
    db = await createBenchDatabase(serverUrl);
    const upstream = await startChild("upstream", "upstream.ts", childEnv(), 30_000);
    children.push(upstream);
    const env = { ...childEnv(), UPSTREAM_URL: upstream.url };
    const proxy = await startChild("proxy", "proxy.ts", env, 30_000);
    const floor = await startChild("floor", "floor.ts", env, 30_000);
    const floorDb = await startChild(
      "floor-db",
      "floor.ts",
      { ...env, FLOOR_DATABASE_URL: db.url },
      30_000,
    );
    const floorGroup = await startChild(
      "floor-db-group",
      "floor.ts",
      { ...env, FLOOR_DATABASE_URL: db.url, FLOOR_GROUP_COMMIT: "true" },
      30_000,
    );
    children.push(proxy, floor, floorDb, floorGroup);

    const headers = { authorization: "Bearer floor", "content-type": "application/json" };
    const measured: [string, ChildHandle][] = [
      ["proxy", proxy],
      ["floor, no database", floor],
      ["floor, INSERT before + UPDATE after", floorDb],
      ["floor, the same with group commit", floorGroup],
    ];
    const targets = measured.map(([, child]): Target => ({
      name: "gateway",
      url: child.url,
      headers: { ...headers },
    }));
    for (const [i, target] of targets.entries()) {
      const check = await preflight(target, "json");
      if (!check.ok) throw new Error(`${measured[i]![0]} preflight: ${check.detail}`);
    }

    log(`unloaded: ${unloadedRequests} sequential JSON requests each, interleaved`);
    const samplers = targets.map((t) => new UnloadedSampler(t, "json"));
    for (const s of samplers) await s.run(30, true);
    const rounds = 6;
    for (let round = 0; round < rounds; round++) {
      for (const s of samplers) await s.run(Math.ceil(unloadedRequests / rounds));
    }
    samplers.forEach((s) => s.close());

    const rows: Row[] = [];
    for (const [i, target] of targets.entries()) {
      const [name, child] = measured[i]!;
      log(`load: ${name}, ${connections} connections, ${seconds} s`);
      if (warmupSeconds > 0) {
        await load(target, "json", { connections, seconds: warmupSeconds });
        await sleep(500);
      }
      const before = (await child.stats()).cpu;
      const result = await load(target, "json", { connections, seconds });
      const after = (await child.stats()).cpu;
      const cpuMs = (after.user + after.system - before.user - before.system) / 1000;
      const sampler = samplers[i]!;
      rows.push({
        name,
        p50Ms: percentiles(sampler.total)?.p50 ?? NaN,
        requestsPerSecond: result.requestsPerSecond,
        cpuMsPerRequest: result.ok > 0 ? cpuMs / result.ok : NaN,
        bad:
          result.non2xx +
          result.errors +
          sampler.failures.length +
          [...sampler.statuses].filter(([code]) => code !== 200).reduce((a, [, n]) => a + n, 0),
      });
    }

    const proxyRow = rows[0]!;
    const lines = [
      "",
      `Floor benchmark — ${new Date().toISOString()}`,
      `node ${process.version}, ${availableParallelism()} CPUs; JSON only; ${connections} connections, ${seconds} s; unloaded ${unloadedRequests} requests`,
      "",
      "target                                  req/s  of proxy  CPU ms/req  unloaded p50 ms  added ms  failed",
      ...rows.map(
        (r) =>
          `${r.name.padEnd(38)}${r.requestsPerSecond.toFixed(0).padStart(7)}` +
          `${`${((100 * r.requestsPerSecond) / proxyRow.requestsPerSecond).toFixed(1)}%`.padStart(10)}` +
          `${r.cpuMsPerRequest.toFixed(3).padStart(12)}${r.p50Ms.toFixed(3).padStart(17)}` +
          `${(r.p50Ms - proxyRow.p50Ms).toFixed(3).padStart(10)}${String(r.bad).padStart(8)}`,
      ),
      "",
      "The targets for the gateway (issue 11): at least 35% of the proxy's JSON req/s, at most 0.5 ms added.",
    ];
    process.stdout.write(`${lines.join("\n")}\n`);
    return rows.some((r) => r.bad > 0) ? 1 : 0;
  } catch (error) {
    log(`failed: ${(error as Error).stack ?? String(error)}`);
    return 2;
  } finally {
    clearTimeout(watchdog);
    for (const child of children.reverse()) await child.stop();
    await db?.drop();
  }
}

process.exitCode = await main();
