import type { IncomingHttpHeaders } from "node:http";
import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { AuditOutcome } from "../src/domain/audits/runner.js";
import { judgeMarket } from "../src/domain/audits/evidence.js";
import type { ModelAuditInput, OfferAuditVerdict } from "../src/domain/audits/types.js";
import { seededRandom } from "../src/domain/audits/random.js";
import { loadAuditCorpus } from "../src/adapters/audits/corpus.js";
import { ksTwoSample, startAuditStack, type AuditStack } from "./helpers/audits.js";
import type { FakeRequest } from "./helpers/fake-upstream.js";

/**
 * Issue 39, acceptance: "An audit request cannot be told from a client's by anything the
 * provider receives (a test compares the two request streams field by field: headers, body
 * members, timing distribution)."
 *
 * The attack is the provider's: it sees every request the gateway sends it (a real HTTP fake
 * upstream records them) and looks for anything that sets audits apart. A client mix (several
 * SDKs' framings: compact, Python-spaced and pretty JSON, the Messages and Responses dialects,
 * streamed or not, temperature 0 and 1, one with a `user`; from three payers, since an audit
 * copies only what several payers send) and the auditor run against it on
 * one virtual timeline: client arrivals a seeded Poisson process, the auditor's its own
 * schedule (`nextDelayMs`), each request sent at its turn, so what the provider receives is
 * compared field by field, and the arrival times by a two-sample Kolmogorov–Smirnov test.
 */

const model = "demo-chat";
const clientRatePerMs = 1 / 1000;

type Layout = "compact" | "spaced" | "pretty";
const layouts: Record<Layout, (v: unknown) => string> = {
  compact: (v) => JSON.stringify(v),
  spaced: (v) => spaced(v),
  pretty: (v) => JSON.stringify(v, null, 2),
};

function spaced(v: unknown): string {
  if (v === null || typeof v !== "object") return JSON.stringify(v);
  if (Array.isArray(v)) return `[${v.map(spaced).join(", ")}]`;
  return `{${Object.entries(v)
    .map(([k, x]) => `${JSON.stringify(k)}: ${spaced(x)}`)
    .join(", ")}}`;
}

interface Profile {
  readonly path: string;
  readonly layout: Layout;
  readonly body: (text: string) => Record<string, unknown>;
}

/** What the gateway's clients send (each an SDK's framing); their texts are the test's own. */
const profiles: Profile[] = [
  {
    path: "/v1/chat/completions",
    layout: "compact",
    body: (text) => ({
      model,
      messages: [{ role: "user", content: text }],
      temperature: 0,
      max_tokens: 64,
    }),
  },
  {
    path: "/v1/chat/completions",
    layout: "spaced",
    body: (text) => ({
      messages: [
        { role: "system", content: "You are a helpful assistant." },
        { role: "user", content: text },
      ],
      model,
      temperature: 1,
      top_p: 0.9,
      stream: true,
    }),
  },
  {
    path: "/v1/chat/completions",
    layout: "pretty",
    body: (text) => ({
      model,
      messages: [
        { role: "user", content: "Hi" },
        { role: "assistant", content: "Hello! How can I help?" },
        { role: "user", content: text },
      ],
      temperature: 0,
      stream: false,
    }),
  },
  {
    path: "/v1/messages",
    layout: "compact",
    body: (text) => ({
      model,
      max_tokens: 128,
      system: "Be brief.",
      messages: [{ role: "user", content: text }],
      temperature: 1,
      stream: true,
    }),
  },
  {
    path: "/v1/responses",
    layout: "compact",
    body: (text) => ({
      model,
      input: [{ role: "user", content: text }],
      temperature: 0,
      max_output_tokens: 100,
    }),
  },
  {
    // Content the auditor must never copy: a `user`.
    path: "/v1/chat/completions",
    layout: "compact",
    body: (text) => ({
      model,
      messages: [{ role: "user", content: text }],
      temperature: 1,
      user: "customer-4711",
    }),
  },
];

let a: AuditStack;
let vnow = Date.now();
let clientCount = 0;
/** The clients' payers' permits (an audit copies what several payers send: shapes.ts). */
const clientPermits: Hex[] = [];

async function sendClient(profile: Profile, permitId: Hex): Promise<void> {
  clientCount += 1;
  const res = await fetch(`${a.gateway.url}${profile.path}`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${a.stack.apiKey}`,
      "content-type": "application/json",
      "x-gateway-permit": permitId,
    },
    body: layouts[profile.layout](profile.body(`client question number ${clientCount}`)),
  });
  await res.text();
  expect(res.status).toBe(200);
}

/** One request the provider received, with the virtual time it was sent at and who sent it. */
interface Seen {
  readonly request: FakeRequest;
  readonly at: number;
  readonly audit: boolean;
}

const seen: Seen[] = [];
/** What the statistics were handed, and what the standing was given (their ports, recorded). */
const judged: ModelAuditInput[][] = [];
const saved: (readonly OfferAuditVerdict[])[] = [];
const outcomes: AuditOutcome[] = [];

beforeAll(async () => {
  a = await startAuditStack(
    // Audits as frequent as half the clients, so the two streams are of comparable size.
    { requestsPerOfferPerDay: 43_200 },
    {
      rng: seededRandom(20261130),
      nowMs: () => vnow,
      judge: (models) => {
        judged.push([...models]);
        return models.flatMap((m) =>
          [...m.offers.keys()].map((offerId) => ({
            offerId,
            modelId: m.modelId,
            state: "unaudited" as const,
            eValue: 1,
            flagAt: 20,
            excludeAt: 1000,
            reference: { kind: "majority" as const },
            tests: [],
          })),
        );
      },
      saveVerdicts: async (verdicts) => {
        saved.push(verdicts);
      },
    },
  );
  // Three payers (the demo payer, anvil's accounts 5 and 6), their permits spent by one key.
  clientPermits.push(...a.clientPermits);
  const runner = a.gateway.audits!;
  const chats = () => a.fake.requests.filter((r) => r.path === "/v1/chat/completions");
  // Warm-up: the auditor learns what clients send (none of it is compared).
  for (const permitId of clientPermits)
    for (const profile of profiles) await sendClient(profile, permitId);
  const rng = seededRandom(7);
  let nextClient = vnow - Math.log(1 - rng()) / clientRatePerMs;
  let nextAudit = vnow + runner.nextDelayMs(1);
  let audits = 0;
  while (audits < 40) {
    const audit = nextAudit < nextClient;
    vnow = audit ? nextAudit : nextClient;
    const before = chats().length;
    if (audit) {
      const outcome = await runner.runOnce();
      outcomes.push(outcome);
      if (outcome.status === "failed") throw outcome.error;
      expect(outcome.status).toBe("sent");
      audits += 1;
      nextAudit = vnow + runner.nextDelayMs(1);
    } else {
      const profile = profiles[Math.floor(rng() * profiles.length)]!;
      await sendClient(profile, clientPermits[clientCount % clientPermits.length]!);
      nextClient = vnow - Math.log(1 - rng()) / clientRatePerMs;
    }
    const after = chats();
    expect(after.length).toBe(before + 1);
    seen.push({ request: after[after.length - 1]!, at: vnow, audit });
  }
}, 120_000);

afterAll(async () => {
  await a?.stack.close();
  await a?.fake.stop();
});

/** Headers as the provider saw them, less what differs per request by nature (the length). */
function headerSet(headers: IncomingHttpHeaders): string {
  const kept = Object.entries(headers)
    .filter(([name]) => name !== "content-length")
    .map(([name, value]) => `${name}: ${String(value)}`)
    .sort();
  return kept.join("\n");
}

/** How a body is laid out: one member a line (the gateway's spliced `max_tokens` may lead), `": `, or compact. */
function layoutOf(raw: string): string {
  const indent = /\n( +)"/.exec(raw);
  if (indent !== null) return `pretty:${indent[1]!.length}`;
  return /": /.test(raw) ? "spaced" : "compact";
}

function body(s: Seen): Record<string, unknown> {
  return s.request.body as Record<string, unknown>;
}

function framing(s: Seen): string[] {
  return (body(s)["messages"] as Record<string, unknown>[]).map(
    (m) => `${Object.keys(m).join(",")}:${typeof m["content"]}`,
  );
}

describe("what the provider receives: audits among clients", () => {
  const clients = () => seen.filter((s) => !s.audit);
  const audits = () => seen.filter((s) => s.audit);

  it("the audits are the corpus's prompts, paid by the audit permit, through several framings", async () => {
    const corpus = await loadAuditCorpus();
    const texts = new Set(
      [...corpus.prompts, ...corpus.probes].map((p) => p.turns[p.turns.length - 1]!.content),
    );
    for (const s of audits()) {
      const messages = body(s)["messages"] as { role: string; content: unknown }[];
      const last = messages[messages.length - 1]!.content;
      expect(
        texts.has(typeof last === "string" ? last : (last as { text: string }[])[0]!.text),
      ).toBe(true);
    }
    // The auditor copied several client framings (dialects, layouts), not one of its own.
    expect(
      new Set(audits().map((s) => Object.keys(body(s)).join(","))).size,
    ).toBeGreaterThanOrEqual(3);
    const ids = outcomes.flatMap((o) => (o.status === "sent" ? [o.answer.requestId!] : []));
    const { rows } = await a.stack.database.db.pool.query<{
      permit_id: string;
      api_key_id: string;
    }>(
      "SELECT DISTINCT permit_id, api_key_id FROM inference_requests WHERE id = ANY ($1::text[])",
      [ids],
    );
    expect(rows).toEqual([{ permit_id: a.auditPermit, api_key_id: a.auditKeyId }]);
  });

  it("headers: every audit's header set is one clients' requests show", () => {
    const clientHeaders = new Set(clients().map((s) => headerSet(s.request.headers)));
    for (const s of audits()) expect(clientHeaders).toContain(headerSet(s.request.headers));
  });

  it("body members: each audit's members, in their order, are a client's", () => {
    const clientMembers = new Set(clients().map((s) => Object.keys(body(s)).join(",")));
    for (const s of audits()) expect(clientMembers).toContain(Object.keys(body(s)).join(","));
  });

  it("parameters: each value an audit sends is one clients send (temperature, limits, stream...)", () => {
    const values = new Map<string, Set<string>>();
    for (const s of clients())
      for (const [k, v] of Object.entries(body(s)))
        if (k !== "messages") values.set(k, (values.get(k) ?? new Set()).add(JSON.stringify(v)));
    for (const s of audits())
      for (const [k, v] of Object.entries(body(s)))
        if (k !== "messages") expect(values.get(k), k).toContain(JSON.stringify(v));
  });

  it("layout and message framing: as clients write them (members and layout together)", () => {
    const signature = (s: Seen) => `${Object.keys(body(s)).join(",")} ${layoutOf(s.request.raw)}`;
    const clientSignatures = new Set(clients().map(signature));
    const clientFraming = new Set(clients().flatMap(framing));
    for (const s of audits()) {
      expect(clientSignatures).toContain(signature(s));
      for (const f of framing(s)) expect(clientFraming).toContain(f);
    }
    // Every layout clients use reaches audits too (the spaced and pretty ones are not dropped).
    expect(new Set(audits().map((s) => layoutOf(s.request.raw)))).toEqual(
      new Set(
        clients().flatMap((s) => (body(s)["user"] === undefined ? [layoutOf(s.request.raw)] : [])),
      ),
    );
  });

  it("nothing names the audit: no header, no user, no metadata, no word of it", () => {
    for (const s of audits()) {
      expect(headerSet(s.request.headers)).not.toMatch(/audit/i);
      expect(s.request.raw).not.toMatch(/audit/i);
      expect(body(s)).not.toHaveProperty("user");
      expect(body(s)).not.toHaveProperty("metadata");
    }
  });

  it("timing: the gap before an audit is distributed as the gap before a client's request (KS, 0.01)", () => {
    const gaps = (kind: boolean) =>
      seen.flatMap((s, i) => (i > 0 && s.audit === kind ? [s.at - seen[i - 1]!.at] : []));
    const audit = gaps(true);
    const client = gaps(false);
    expect(audit.length).toBeGreaterThanOrEqual(39);
    expect(client.length).toBeGreaterThanOrEqual(40);
    expect(ksTwoSample(audit, client).p).toBeGreaterThan(0.01);
  });

  it("the same test catches an auditor that sends in bursts (an MMD batch at once)", () => {
    // The attack the schedule avoids: the same audits, five at a time.
    const rng = seededRandom(3);
    const times: { at: number; audit: boolean }[] = [];
    let t = 0;
    for (let i = 0; i < 80; i += 1)
      times.push({ at: (t -= Math.log(1 - rng()) * 1000), audit: false });
    for (let burst = 0; burst < 8; burst += 1) {
      const at = rng() * t;
      for (let k = 0; k < 5; k += 1) times.push({ at: at + k, audit: true });
    }
    times.sort((x, y) => x.at - y.at);
    const gaps = (kind: boolean) =>
      times.flatMap((s, i) => (i > 0 && s.audit === kind ? [s.at - times[i - 1]!.at] : []));
    expect(ksTwoSample(gaps(true), gaps(false)).p).toBeLessThan(0.01);
  });

  it("what came back is stored, and the evaluation hands each model's samples to the statistics and the verdicts to the standing", async () => {
    const verdicts = await a.gateway.audits!.evaluate();
    expect(judged).toHaveLength(1);
    const [input] = judged[0]!;
    expect(input!.modelId).toBe(a.modelId);
    expect(input!.anchorOfferId).toBeUndefined();
    expect([...input!.offers.keys()]).toEqual([a.chatOffer]);
    const samples = input!.offers.get(a.chatOffer)!;
    const sent = outcomes.filter((o) => o.status === "sent");
    expect(samples.map((x) => [x.test, x.promptId])).toEqual(sent.map((o) => [o.test, o.promptId]));
    // The first characters of the visible answer, whatever the dialect and framing carried it.
    expect(new Set(samples.map((x) => x.text))).toEqual(new Set(["word0 word1"]));
    expect(saved).toEqual([verdicts]);
    expect(verdicts.map((v) => v.offerId)).toEqual([a.chatOffer]);
    // The statistics the gateway runs by default read the same input: one offer of the model has
    // no peer to be compared with (no anchor, no majority), so it stays unaudited.
    expect(judgeMarket(judged[0]!).map((v) => [v.offerId, v.state])).toEqual([
      [a.chatOffer, "unaudited"],
    ]);
  });
});
