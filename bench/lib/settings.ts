/**
 * The settings `npm run bench` and `npm run bench:floor` share, read from the environment, and
 * the environment their child processes get.
 */

export interface CommonSettings {
  /** Server the `gw_bench_<hex>` database is created on (and dropped from). */
  readonly serverUrl: string;
  readonly seconds: number;
  readonly warmupSeconds: number;
  readonly connections: number;
  readonly unloadedRequests: number;
}

/** An integer setting from the environment; out of range or not an integer: an error. */
export function intSetting(name: string, fallback: number, min: number, max: number): number {
  const raw = process.env[name]?.trim();
  if (raw === undefined || raw === "") return fallback;
  if (!/^\d+$/.test(raw) || Number(raw) < min || Number(raw) > max) {
    throw new Error(`${name} must be an integer from ${min} to ${max}, got "${raw}"`);
  }
  return Number(raw);
}

export function readCommonSettings(): CommonSettings {
  return {
    serverUrl: process.env.BENCH_DATABASE_URL || "postgres://postgres@127.0.0.1:5432/test",
    seconds: intSetting("BENCH_SECONDS", 10, 1, 300),
    warmupSeconds: intSetting("BENCH_WARMUP_SECONDS", 2, 0, 60),
    connections: intSetting("BENCH_CONNECTIONS", 32, 1, 512),
    unloadedRequests: intSetting("BENCH_UNLOADED_REQUESTS", 300, 10, 5000),
  };
}

/** Only the variables a child needs, so the caller's shell cannot change what is measured. */
export function baseEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const key of ["PATH", "HOME", "TMPDIR", "LANG", "TZ"]) {
    if (process.env[key] !== undefined) env[key] = process.env[key];
  }
  return env;
}
