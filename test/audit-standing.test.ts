import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readAuditStandings, saveAuditVerdicts } from "../src/adapters/pg/audits.js";
import { runAuditsCommand } from "../src/cli/audits.js";
import { verifyOffer } from "../src/clients/provider.js";
import type { AuditState, OfferAuditVerdict } from "../src/domain/audits/types.js";
import { describeIfPostgres } from "./helpers/db.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { secondChatOffer } from "./helpers/market.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";
import { demoChat, useTwoGateways } from "./helpers/two-gateways.js";

/**
 * Offers serve the model they sell (issue 39, item 4 and the acceptance line "an offer beyond
 * the stronger threshold receives no client request, pinned ones included (503 with a reason),
 * until it verifies again"; docs/decisions/audits.md): two offers of `demo-chat` on their own
 * fake providers, `a` cheaper (ranked first), `b` dearer. The market's verdicts are written
 * straight into the store (the statistics that produce them are tested on their own), as the
 * process that judged the market writes them. The tests run in order.
 */

const messages = [{ role: "user" as const, content: "hello gateway" }];
const chatPath = "/v1/chat/completions";

/** A verdict as the statistics would hand it over, with one test's evidence. */
function verdict(stack: TestStack, offerId: Hex, state: AuditState, eValue: number) {
  return {
    offerId,
    modelId: stack.demo.models[0]!.modelId,
    state,
    eValue,
    flagAt: 40,
    excludeAt: 400,
    reference: { kind: "majority" },
    tests: [
      {
        test: "mmd",
        samples: 64,
        referenceSamples: 128,
        statistic: 0.0123456789,
        pValue: 0.00042,
        eValue,
      },
    ],
  } satisfies OfferAuditVerdict;
}

interface AuditView {
  state: string;
  e_value: string;
  flag_at: string | null;
  exclude_at: string | null;
  reference_kind: string | null;
  updated_at: number | null;
  model_mismatch: boolean;
}

describe("an offer its audits exclude receives no client request until it verifies again", () => {
  let stack: TestStack;
  let fakeA: FakeUpstream;
  let fakeB: FakeUpstream;
  let a: Hex;
  let b: Hex;
  const chat = demoChat(() => stack);
  /** Writes the verdicts as the judging process does, and runs this process's round now. */
  const judge = async (verdicts: OfferAuditVerdict[], readAtMs = Date.now()) => {
    await saveAuditVerdicts(stack.database.db.pool, verdicts, { readAtMs, nowMs: Date.now() });
    await stack.gateway.standings.refresh();
  };
  const servedBy = async (body: object = {}) => {
    const res = await chat(body);
    const text = await res.text();
    expect(res.status, text).toBe(200);
    return res.headers.get("x-gateway-offer-id");
  };
  const refusal = async (body: object) => {
    const res = await chat(body);
    expect(res.status).toBe(503);
    return (await json(res)).error as { code: string; message: string };
  };
  const offersView = async () =>
    (await json(await authed(stack, "/v1/models/demo-chat/offers"))).data as {
      offer_id: string;
      audit: AuditView;
      reputation: { model_mismatch: boolean; score: number | null };
    }[];
  const shown = async (offer: Hex) => (await offersView()).find((o) => o.offer_id === offer)!;
  const quote = (body: object) =>
    authed(stack, "/v1/quotes", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "demo-chat", messages, ...body }),
    });
  const calls = () => ({ a: fakeA.calls(chatPath), b: fakeB.calls(chatPath) });
  let clearedAtMs = 0;

  beforeAll(async () => {
    const started = await startChatStack({
      PERMIT_CACHE_MS: "0",
      VERIFY_MIN_INTERVAL_SECONDS: "0",
    });
    stack = started.stack;
    fakeA = started.fake;
    a = started.chatOffer;
    ({ b, fakeB } = await secondChatOffer(stack));
  }, 120_000);
  afterAll(async () => {
    await fakeB?.stop();
    await fakeA?.stop();
    await stack?.close();
  });

  it("shows every offer unaudited before any verdict, and routes to the cheaper one", async () => {
    const unaudited = {
      state: "unaudited",
      e_value: "1",
      flag_at: null,
      exclude_at: null,
      reference_kind: null,
      updated_at: null,
      model_mismatch: false,
    };
    expect((await shown(a)).audit).toEqual(unaudited);
    expect((await shown(b)).audit).toEqual(unaudited);
    expect(await servedBy()).toBe(a);
  });

  it("sends no client request to an excluded offer, pinned ones included (503 offer_model_mismatch)", async () => {
    await judge([verdict(stack, a, "excluded", 1234.5678), verdict(stack, b, "passing", 0.5)]);
    const before = calls();
    const answers = [
      await servedBy(),
      await servedBy({ stream: true }),
      await servedBy({ provider: { sort: "price" } }),
      await servedBy({ provider: { order: [a] } }),
    ];
    expect(answers).toEqual([b, b, b, b]);
    // Every way of pinning the offer is refused naming why, with nothing sent to it.
    for (const pin of [
      { offer: a },
      { offer: a, stream: true },
      { provider: { only: [a] } },
      { provider: { order: [a], allow_fallbacks: false } },
    ]) {
      const error = await refusal(pin);
      expect(error.code).toBe("offer_model_mismatch");
      expect(error.message).toBe(
        `offer ${a} is out of routing: its audits found it serving another model than the one it sells; it returns once its operator verifies it again`,
      );
    }
    const pinnedQuote = await quote({ offer: a });
    expect(pinnedQuote.status).toBe(503);
    expect((await json(pinnedQuote)).error.code).toBe("offer_model_mismatch");
    expect(calls()).toEqual({ a: before.a, b: before.b + 4 });

    // The catalog shows it, and its reputation says model_mismatch.
    const excluded = await shown(a);
    expect(excluded.audit).toEqual({
      state: "excluded",
      e_value: "1234.57",
      flag_at: "40",
      exclude_at: "400",
      reference_kind: "majority",
      updated_at: excluded.audit.updated_at,
      model_mismatch: true,
    });
    expect(Math.abs(excluded.audit.updated_at! - Date.now() / 1000)).toBeLessThan(60);
    expect(excluded.reputation.model_mismatch).toBe(true);
    expect(excluded.reputation.score).toBe(0);
    expect((await shown(b)).audit).toMatchObject({ state: "passing", model_mismatch: false });
    expect((await shown(b)).reputation.model_mismatch).toBe(false);
  });

  it("keeps it excluded whatever a later verdict says, until a verification passes", async () => {
    await judge([verdict(stack, a, "passing", 2)]);
    expect((await shown(a)).audit).toMatchObject({ state: "excluded", e_value: "2" });
    expect((await refusal({ offer: a })).code).toBe("offer_model_mismatch");
  });

  it("routes to it again once a verification of it passes, its evidence cleared", async () => {
    const judgedBefore = Date.now() - 1;
    await verifyOffer({ baseUrl: stack.gateway.url, apiKey: stack.apiKey }, a);
    await stack.gateway.standings.refresh();
    const before = calls();
    expect(await servedBy()).toBe(a);
    expect(await servedBy({ offer: a, stream: true })).toBe(a);
    expect(calls()).toEqual({ a: before.a + 2, b: before.b });
    const standing = (await readAuditStandings(stack.database.db.pool)).get(a)!;
    expect(standing).toMatchObject({ state: "unaudited", eValue: 1, tests: [] });
    expect(standing.clearedAtMs).toBeGreaterThan(judgedBefore);
    clearedAtMs = standing.clearedAtMs!;
    expect((await shown(a)).audit).toMatchObject({ state: "unaudited", model_mismatch: false });

    // A verdict judged from samples read before the clearing does not bring it back.
    await judge([verdict(stack, a, "excluded", 9999)], judgedBefore);
    expect((await readAuditStandings(stack.database.db.pool)).get(a)!.state).toBe("unaudited");
    expect(await servedBy()).toBe(a);
  });

  it("sorts a flagged offer after every offer that is not, whatever provider.sort says", async () => {
    // Samples read from the end of the verification's second on count (the clearing's bound).
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, clearedAtMs - Date.now() + 1)));
    await judge([verdict(stack, a, "flagged", 50)]);
    expect(await servedBy()).toBe(b);
    expect(await servedBy({ provider: { sort: "price" } })).toBe(b);
    // Flagged, not excluded: a request pinned to it is still served by it.
    expect(await servedBy({ offer: a })).toBe(a);
    expect((await shown(a)).audit).toMatchObject({ state: "flagged", model_mismatch: true });
  });

  it("provider.require_audited routes only to offers whose audits pass", async () => {
    await judge([verdict(stack, a, "unaudited", 1), verdict(stack, b, "passing", 0.5)]);
    // Unflagged again, a is the cheaper; b is the only one audited.
    expect(await servedBy()).toBe(a);
    expect(await servedBy({ provider: { require_audited: true } })).toBe(b);
    const pinned = await refusal({ offer: a, provider: { require_audited: true } });
    expect(pinned.code).toBe("no_eligible_offer");
    expect(pinned.message).toContain("provider.require_audited");

    // The quote names the offer and what its audits say.
    const quoted = await json(await quote({ provider: { require_audited: true } }));
    expect(quoted.offer_id).toBe(b);
    expect(quoted.audit).toMatchObject({
      state: "passing",
      e_value: "0.5",
      flag_at: "40",
      exclude_at: "400",
      reference_kind: "majority",
      model_mismatch: false,
    });
    expect((await json(await quote({}))).audit).toMatchObject({ state: "unaudited" });

    await judge([verdict(stack, b, "flagged", 41)]);
    const none = await refusal({ provider: { require_audited: true } });
    expect(none.code).toBe("no_eligible_offer");
    expect(none.message).toContain("provider.require_audited");
  });

  it("shows the operator every standing with its evidence, and no one else", async () => {
    const list = (token: string) =>
      fetch(`${stack.gateway.url}/audits/standings`, {
        headers: { authorization: `Bearer ${token}` },
      });
    const refused = await list(stack.apiKey);
    expect(refused.status).toBe(401);
    expect((await json(refused)).error.code).toBe("invalid_operator_token");
    const { object, data } = await json(await list(stack.operatorToken));
    expect(object).toBe("list");
    const ofB = data.find((s: { offer_id: string }) => s.offer_id === b);
    expect(ofB).toEqual({
      object: "audit_standing",
      offer_id: b,
      model_id: stack.demo.models[0]!.modelId,
      audit: {
        state: "flagged",
        e_value: "41",
        flag_at: "40",
        exclude_at: "400",
        reference_kind: "majority",
        updated_at: ofB.audit.updated_at,
        model_mismatch: true,
      },
      reference_offer_id: null,
      cleared_at: null,
      tests: [
        {
          test: "mmd",
          samples: 64,
          reference_samples: 128,
          statistic: "0.0123457",
          p_value: "0.00042",
          e_value: "41",
        },
      ],
    });
    expect(data.map((s: { offer_id: string }) => s.offer_id).sort()).toEqual([a, b].sort());
    const ofA = data.find((s: { offer_id: string }) => s.offer_id === a);
    expect(ofA.cleared_at).toBeTypeOf("number");

    // `gateway audits`: the same, over gRPC with the operator token.
    const run = async (args: string[], token = stack.operatorToken) => {
      const out: string[] = [];
      const error: string[] = [];
      const env = { GATEWAY_URL: stack.gateway.url, SETTLEMENT_OPERATOR_TOKEN: token };
      const code = await runAuditsCommand(args, env, {
        out: (line) => out.push(line),
        error: (line) => error.push(line),
      });
      return { code, out, error, command: ["gateway", "audits", ...args].join(" ") };
    };
    const modelId = stack.demo.models[0]!.modelId;
    const printed = await run(["--model", modelId]);
    expect(printed.code, printed.command).toBe(0);
    const lines = printed.out.flatMap((l) => l.split("\n"));
    const at = lines.indexOf(`offer ${b} (model ${modelId})`);
    expect(at).toBeGreaterThanOrEqual(0);
    expect(lines.slice(at + 1, at + 4)).toEqual([
      "  state flagged (model_mismatch): e-value 41, flags at 40, excluded at 400",
      `  reference majority; updated ${new Date(ofB.audit.updated_at * 1000).toISOString()}; evidence cleared never`,
      "  mmd: 64 samples against 128 of the reference, statistic 0.0123457, p-value 0.00042, e-value 41",
    ]);
    expect(lines).toContain(`offer ${a} (model ${modelId})`);
    expect((await run(["--model", `0x${"ab".repeat(32)}`])).out).toEqual([
      "no offer has been judged by the audits yet",
    ]);
    const asJson = JSON.parse((await run(["--json"])).out.join("\n"));
    expect(asJson.standings).toHaveLength(2);
    const refusedCli = await run([], `op_${"0".repeat(32)}`);
    expect(refusedCli.code).toBe(1);
    expect(refusedCli.error.join("\n")).toContain("invalid_operator_token");
    expect(refusedCli.error.join("\n")).not.toContain(stack.operatorToken);
    expect((await run(["--model", "0x12"])).code).toBe(2);
  });
});

describeIfPostgres("two gateway processes agree on an audit exclusion", () => {
  const two = useTwoGateways();
  const chat = demoChat(() => two().stack);

  it("the process that did not write the verdict stops routing to the offer after its round", async () => {
    const { stack, second, fakeA, a, b } = two();
    const first = await chat({}, second);
    expect(first.status).toBe(200);
    expect(first.headers.get("x-gateway-offer-id")).toBe(a);
    // Another process (here: the test, on the shared database) judged the market.
    await saveAuditVerdicts(stack.database.db.pool, [verdict(stack, a, "excluded", 5000)], {
      readAtMs: Date.now(),
      nowMs: Date.now(),
    });
    // The second process's round (every 5 s) reads it: its catalog shows it, then routing.
    await eventually(
      async () => {
        const { data } = await json(
          await fetch(`${second.url}/v1/models/demo-chat/offers`, {
            headers: { authorization: `Bearer ${stack.apiKey}` },
          }),
        );
        const shown = (data as { offer_id: string; audit: AuditView }[]).find(
          (o) => o.offer_id === a,
        );
        return shown?.audit.state === "excluded";
      },
      10_000,
      100,
    );
    const callsA = fakeA.calls(chatPath);
    for (let i = 0; i < 3; i++) {
      const res = await chat(i % 2 === 0 ? {} : { stream: true }, second);
      await res.text();
      expect(res.status).toBe(200);
      expect(res.headers.get("x-gateway-offer-id")).toBe(b);
    }
    const pinned = await chat({ offer: a }, second);
    expect(pinned.status).toBe(503);
    expect((await json(pinned)).error.code).toBe("offer_model_mismatch");
    expect(fakeA.calls(chatPath)).toBe(callsA);
    // A restart reads it before it serves.
    const restarted = await stack.restart();
    const afterRestart = await chat({ offer: a }, restarted);
    expect(afterRestart.status).toBe(503);
    expect((await json(afterRestart)).error.code).toBe("offer_model_mismatch");
    expect(fakeA.calls(chatPath)).toBe(callsA);
  });
});
