import type { Hex } from "viem";
import { createApiKey } from "../../src/adapters/pg/api-keys.js";
import { startGateway, type Gateway } from "../../src/app.js";
import type { AuditOptions } from "../../src/app/audits.js";
import type { AuditConfig } from "../../src/config/audits.js";
import { apiKeyIdOf } from "../../src/domain/api-key-check.js";
import { authorizeKey } from "./authorize.js";
import { auditSecret } from "./log-audit.js";
import { openPermit } from "./market.js";
import { startChatStack, type TestStack } from "./stack.js";
import type { FakeUpstream } from "./fake-upstream.js";

/**
 * A chat stack whose gateway runs the blind audits (issue 39): the demo payer stands for the
 * operator, with an audit permit on `demo-chat` and an audit API key it authorized; the gateway
 * is restarted with the audits configured (their choices seeded, their clock the test's, no
 * timers: the test calls `runOnce`).
 */
export interface AuditStack {
  readonly stack: TestStack;
  readonly fake: FakeUpstream;
  readonly chatOffer: Hex;
  readonly modelId: Hex;
  readonly auditPermit: Hex;
  readonly auditKeyId: string;
  /** A permit of a client (the demo payer's, spent with the stack's key). */
  readonly clientPermit: Hex;
  /**
   * Permits of three client payers (the demo payer's first, then anvil's accounts 5 and 6),
   * each spent with the stack's key: an audit copies only a framing several payers sent
   * (src/domain/audits/shapes.ts), so clients whose framing audits copy send from all three.
   */
  readonly clientPermits: readonly Hex[];
  /** The gateway now (restartWith replaces it). */
  gateway: Gateway;
  /** Stops the gateway and starts it again with these audit settings and options. */
  restartWith(settings: AuditSettings, options: AuditOptions): Promise<Gateway>;
}

export type AuditSettings = Partial<Omit<AuditConfig, "auditApiKey" | "permits">> & {
  readonly env?: Record<string, string>;
};

export async function startAuditStack(
  settings: AuditSettings,
  options: AuditOptions,
): Promise<AuditStack> {
  const { stack, fake, chatOffer } = await startChatStack(settings.env ?? {});
  try {
    const modelId = stack.demo.models[0]!.modelId;
    const clientPermit = await openPermit(stack, { deposit: 10n ** 24n });
    const clientPermits: Hex[] = [clientPermit];
    for (const account of stack.anvil.accounts.slice(5, 7)) {
      const permitId = await openPermit(stack, {
        deposit: 10n ** 24n,
        payerPrivateKey: account.privateKey,
      });
      await authorizeKey(stack.gateway.url, stack.apiKey, account.privateKey, { permitId });
      clientPermits.push(permitId);
    }
    const auditPermit = await openPermit(stack, { deposit: 10n ** 24n });
    const auditKey = (await createApiKey(stack.database.db.pool, "audits")).key;
    auditSecret("api key", auditKey);
    await authorizeKey(stack.gateway.url, auditKey, stack.roles.payer.privateKey, {
      permitId: auditPermit,
    });
    const start = async (set: AuditSettings, opts: AuditOptions): Promise<Gateway> => {
      await stack.gateway.close();
      const audits: AuditConfig = {
        auditApiKey: auditKey,
        permits: new Map([[modelId, auditPermit]]),
        anchors: set.anchors ?? new Map(),
        budgetPerOffer: set.budgetPerOffer ?? 10n ** 30n,
        budgetPerModel: set.budgetPerModel ?? 10n ** 30n,
        requestsPerOfferPerDay: set.requestsPerOfferPerDay ?? 100,
        evaluateIntervalMs: set.evaluateIntervalMs ?? 3_600_000,
        evidenceWindowDays: set.evidenceWindowDays ?? 30,
        corpusDir: set.corpusDir,
      };
      stack.gateway = await startGateway(
        { ...stack.config, audits },
        { logger: stack.logger, database: stack.database.db, audits: { start: false, ...opts } },
      );
      return stack.gateway;
    };
    const audited: AuditStack = {
      stack,
      fake,
      chatOffer,
      modelId,
      auditPermit,
      auditKeyId: apiKeyIdOf(auditKey),
      clientPermit,
      clientPermits,
      gateway: await start(settings, options),
      async restartWith(set, opts) {
        audited.gateway = await start(set, opts);
        return audited.gateway;
      },
    };
    return audited;
  } catch (error) {
    await stack.close();
    await fake.stop();
    throw error;
  }
}

/**
 * A client's chat of `demo-chat` on `permitId` with the stack's API key: `body`'s members after
 * `model`, in its order (audits copy a framing member by member).
 */
export function clientChat(
  a: Pick<AuditStack, "stack" | "gateway">,
  permitId: Hex,
  body: Record<string, unknown>,
): Promise<Response> {
  return fetch(`${a.gateway.url}/v1/chat/completions`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${a.stack.apiKey}`,
      "content-type": "application/json",
      "x-gateway-permit": permitId,
    },
    body: JSON.stringify({ model: "demo-chat", ...body }),
  });
}

/**
 * The two-sample Kolmogorov–Smirnov test: the statistic D (the largest gap between the two
 * empirical distribution functions) and its asymptotic p-value (Numerical Recipes' `kstwo`:
 * Q_KS((√n_e + 0.12 + 0.11/√n_e)·D), n_e = nm/(n+m)).
 */
export function ksTwoSample(a: readonly number[], b: readonly number[]): { d: number; p: number } {
  const x = [...a].sort((p, q) => p - q);
  const y = [...b].sort((p, q) => p - q);
  let i = 0;
  let j = 0;
  let d = 0;
  while (i < x.length && j < y.length) {
    const v = Math.min(x[i]!, y[j]!);
    while (i < x.length && x[i]! <= v) i += 1;
    while (j < y.length && y[j]! <= v) j += 1;
    d = Math.max(d, Math.abs(i / x.length - j / y.length));
  }
  const ne = Math.sqrt((x.length * y.length) / (x.length + y.length));
  const lambda = (ne + 0.12 + 0.11 / ne) * d;
  // Q_KS(λ) = 2 Σ (-1)^(k-1) e^(-2k²λ²)
  let p = 0;
  for (let k = 1; k <= 100; k += 1)
    p += 2 * (-1) ** (k - 1) * Math.exp(-2 * k * k * lambda * lambda);
  return { d, p: Math.min(1, Math.max(0, lambda < 1e-3 ? 1 : p)) };
}
