import { privateKeyToAccount } from "viem/accounts";
import type { Hex } from "viem";

/** An authorization as the REST facade answers it. */
export interface AuthorizationView {
  id: string;
  object: "permit_authorization";
  api_key_id: string;
  payer: Hex;
  permit_id: Hex;
  status: "active" | "expired" | "revoked";
  expires_at: number;
  issued_at: number;
  total_cap: string;
  per_request_cap: string;
  period: "" | "day" | "week" | "month";
  period_cap: string;
  period_used: string;
  period_renews_at: number | null;
  warn_at: string;
  warn_reached: boolean;
  credits_used: string;
  credits_reserved: string;
  last_used_at: number | null;
  created_at: number;
  revoked_at: number | null;
  revoked_by: "key" | "payer" | null;
}

/** The typed data without `EIP712Domain`, as viem's `signTypedData` takes it. */
export function signable(typedData: {
  types: Record<string, { name: string; type: string }[]>;
  primaryType: string;
  domain: Record<string, unknown>;
  message: Record<string, unknown>;
}) {
  const { EIP712Domain: _domain, ...types } = typedData.types;
  return { ...typedData, types } as unknown as Parameters<
    ReturnType<typeof privateKeyToAccount>["signTypedData"]
  >[0];
}

/**
 * fetch that waits out a 429 (as a client honouring Retry-After does): stacks with a small
 * per-key rate limit still get their key authorized.
 */
async function patientFetch(url: string, init: RequestInit): Promise<Response> {
  for (let attempt = 0; ; attempt++) {
    const res = await fetch(url, init);
    if (res.status !== 429 || attempt === 10) return res;
    await res.arrayBuffer();
    const wait = Number(res.headers.get("retry-after") ?? "1");
    await new Promise((r) => setTimeout(r, Math.max(1, wait) * 1000));
  }
}

/**
 * Authorizes `apiKey` to spend the permits of the payer whose private key is given, through the
 * gateway's real routes, as a key holder and a payer would: the key asks for the typed data, the
 * payer signs it, the key posts the signature. `permitId` absent: every permit of the payer.
 */
export async function authorizeKey(
  baseUrl: string,
  apiKey: string,
  payerPrivateKey: Hex,
  options: {
    permitId?: Hex;
    expiresAt?: number;
    totalCap?: string;
    perRequestCap?: string;
    period?: string;
    periodCap?: string;
    warnAt?: string;
  } = {},
): Promise<AuthorizationView> {
  const payer = privateKeyToAccount(payerPrivateKey);
  const headers = { authorization: `Bearer ${apiKey}`, "content-type": "application/json" };
  const challenge = await patientFetch(`${baseUrl}/v1/permit-authorizations/challenge`, {
    method: "POST",
    headers,
    body: JSON.stringify({
      payer: payer.address,
      ...(options.permitId === undefined ? {} : { permitId: options.permitId }),
      ...(options.expiresAt === undefined ? {} : { expiresAt: options.expiresAt }),
      ...(options.totalCap === undefined ? {} : { totalCap: options.totalCap }),
      ...(options.perRequestCap === undefined ? {} : { perRequestCap: options.perRequestCap }),
      ...(options.period === undefined ? {} : { period: options.period }),
      ...(options.periodCap === undefined ? {} : { periodCap: options.periodCap }),
      ...(options.warnAt === undefined ? {} : { warnAt: options.warnAt }),
    }),
  });
  if (challenge.status !== 200) {
    throw new Error(
      `permit authorization challenge: ${challenge.status} ${await challenge.text()}`,
    );
  }
  const typedData = (await challenge.json()) as Parameters<typeof signable>[0] & {
    message: {
      payer: Hex;
      permitId: Hex;
      expiresAt: number;
      issuedAt: number;
      deployment: string;
      totalCap: string;
      perRequestCap: string;
      period: string;
      periodCap: string;
      warnAt: string;
      nonce: string;
    };
  };
  const signature = await payer.signTypedData(signable(typedData));
  const posted = await patientFetch(`${baseUrl}/v1/permit-authorizations`, {
    method: "POST",
    headers,
    body: JSON.stringify({
      payer: typedData.message.payer,
      permitId: typedData.message.permitId,
      expiresAt: typedData.message.expiresAt,
      issuedAt: typedData.message.issuedAt,
      deployment: typedData.message.deployment,
      totalCap: typedData.message.totalCap,
      perRequestCap: typedData.message.perRequestCap,
      period: typedData.message.period,
      periodCap: typedData.message.periodCap,
      warnAt: typedData.message.warnAt,
      nonce: typedData.message.nonce,
      signature,
    }),
  });
  if (posted.status !== 200) {
    throw new Error(`permit authorization: ${posted.status} ${await posted.text()}`);
  }
  return ((await posted.json()) as { authorization: AuthorizationView }).authorization;
}
