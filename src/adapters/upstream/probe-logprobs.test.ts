import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  startFakeUpstream,
  type FakeUpstream,
  type LogprobsOf,
} from "../../../test/helpers/fake-upstream.js";
import { createUpstreamClient, type UpstreamClient } from "./http.js";
import { verifyEndpoint } from "./probe.js";

/**
 * The `logprobs` feature (issue 39, item 3): proven only where the endpoint answers
 * log-probabilities that pass the checks the logprob audits apply. An endpoint that claims the
 * feature with values it cannot back gets no logprob audits it could steer, and no client that
 * requires the feature.
 */

const token = "tok-logprobs-secret";
const names = ["acme/llama"];
let upstream: UpstreamClient;
const fakes: FakeUpstream[] = [];

beforeAll(() => {
  upstream = createUpstreamClient({ allowPrivate: true });
});
afterAll(async () => {
  await upstream.close();
});
afterEach(async () => {
  await Promise.all(fakes.splice(0).map((f) => f.stop()));
});

async function verify(opts: Parameters<typeof startFakeUpstream>[0]) {
  const f = await startFakeUpstream({ models: names, token, ...opts });
  fakes.push(f);
  return verifyEndpoint(upstream, { url: f.url, token }, names);
}

describe("the logprobs feature", () => {
  it("is proven where a temperature-0 completion answers log-probabilities that hold up", async () => {
    expect(await verify({ logprobs: true })).toEqual({
      ok: true,
      features: ["stream_usage", "json_schema", "logprobs"],
      unanswered: [],
    });
  });

  it("is not proven without log-probabilities, nor with ones that cannot be true", async () => {
    expect(await verify({})).toMatchObject({ ok: true, features: ["stream_usage", "json_schema"] });
    // At temperature 0 it sent a token it says is less probable than another.
    const notGreedy: LogprobsOf = (_req, pieces) =>
      pieces.map((p) => ({
        logprob: -2,
        top_logprobs: [
          { token: "other", logprob: -0.2 },
          { token: p, logprob: -2 },
        ],
      }));
    // Probabilities that are not: a value above 0.
    const positive: LogprobsOf = (_req, pieces) =>
      pieces.map(() => ({ logprob: 0.3, top_logprobs: [] }));
    for (const logprobs of [notGreedy, positive]) {
      expect(await verify({ logprobs })).toEqual({
        ok: true,
        features: ["stream_usage", "json_schema"],
        unanswered: [],
      });
    }
  });
});
