import { afterAll, expect } from "vitest";

/**
 * Every JSON answer any test gets from a gateway through fetch is checked against the generated
 * OpenAPI document (test/helpers/openapi-doc.ts: status documented for the route, body matching
 * the schema with objects closed), not only the answers of test/openapi.test.ts. A gateway's
 * answer is told by its X-Request-Id header (fake upstreams send none). Event streams and
 * bodies over 256 KiB are left to the tests that read them.
 */

const pending: Promise<string | undefined>[] = [];
// This file runs before each test file, and several test files share a process (vitest.config.ts):
// the wrapper wraps the process's own fetch, kept once, never the previous file's wrapper.
const original = Symbol.for("gateway.test.originalFetch");
const holder = globalThis as { [original]?: typeof fetch };
const realFetch = (holder[original] ??= globalThis.fetch);

globalThis.fetch = async (input, init) => {
  const res = await realFetch(input, init);
  try {
    const type = res.headers.get("content-type") ?? "";
    const length = Number(res.headers.get("content-length") ?? "-1");
    if (
      res.headers.has("x-request-id") &&
      type.startsWith("application/json") &&
      length >= 0 &&
      length <= 256 * 1024
    ) {
      const request = input instanceof Request ? input : undefined;
      const method = (init?.method ?? request?.method ?? "GET").toUpperCase();
      const url = new URL(request?.url ?? String(input));
      const copy = res.clone();
      pending.push(
        copy.text().then(
          async (text) => {
            let body: unknown;
            try {
              body = JSON.parse(text);
            } catch {
              return `${method} ${url.pathname} ${res.status}: not JSON: ${text.slice(0, 200)}`;
            }
            const { answerProblem } = await import("../helpers/openapi-doc.js");
            return answerProblem(method, url.pathname, res.status, body);
          },
          // The connection was cut before the body arrived: nothing to check.
          () => undefined,
        ),
      );
    }
  } catch {
    // a URL or header this check cannot read: the test sees the answer as it came
  }
  return res;
};

afterAll(async () => {
  const problems = (await Promise.all(pending)).filter((p) => p !== undefined);
  expect(problems, "gateway answers that do not match the OpenAPI document").toEqual([]);
});
