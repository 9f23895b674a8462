import type { Hex } from "viem";
import type { ModelRecord } from "../catalog.js";
import { GatewayError } from "../errors.js";
import type { PermitAuthorization } from "../permit-authorization/index.js";
import type { Permit } from "../permits.js";
import type { TokenCounters } from "../tokens.js";
import {
  checkPayment,
  paymentRequiredFor,
  PaymentRequiredError,
  x402PermitId,
  type PriceAsked,
  type UptoPayment,
  type X402Payments,
} from "../x402/index.js";
import { admit, type Admitting, type ChatTurn } from "./admission.js";
import { serve } from "./call.js";
import type { RelayContext } from "./call-state.js";
import { modelLoading, noEligibleOffer } from "./quotes.js";
import { rankCandidates, type RoutingContext } from "./routing.js";

/**
 * A chat request that pays for itself with x402 `upto` (issue 37, DESIGN.md section 11): the
 * steps of `pipeline.ts`'s `run` with the payment in place of the key's permit. Route; without a
 * payment, answer 402 with the request's priced maximum to pay; with one, check it (shape,
 * terms, signature, window, amount), count the prompt, ask the chain (the settlement simulated
 * at the maximum), take it for this request (its nonce, once, on every process, within the
 * exposure caps), then admit and serve as a permit's request: the payment is the request's
 * permit (deposit = the signed amount, any offer of the model) and its signed amount the
 * per-request cap, so a failover never goes above what was signed.
 */

export interface Paying extends Admitting, RelayContext {
  readonly routing: RoutingContext;
  readonly tokens: TokenCounters;
}

export async function runPaid(p: Paying, turn: ChatTurn, x402: X402Payments): Promise<void> {
  const { req, input, now } = turn;
  const paying = input.x402!;
  if (input.quoteId !== undefined || input.permitId !== undefined)
    throw new GatewayError(
      "invalid_request",
      "a request paid with x402 takes no X-Gateway-Permit or X-Gateway-Quote (they need an API key)",
    );
  const { model, offers } = await p.deps.catalog.routingView(req.model);
  const ranked = rankCandidates(offers, model, req, [req.offer], now, p.routing);
  const best = ranked[0];
  if (best === undefined) throw noEligibleOffer(req);
  const price: PriceAsked = {
    amount: best.maximumCredits,
    asset: model.creditToken,
    assetDomain: await x402.assetDomain?.(model.creditToken),
    url: paying.url,
    description: `one chat request to ${req.model}, charged what the gateway meters, at most this amount`,
  };
  const refuse = (code: GatewayError["code"], message: string): PaymentRequiredError =>
    new PaymentRequiredError(code, message, paymentRequiredFor(x402.terms, price, message));
  if (paying.payload === undefined)
    throw refuse(
      "payment_required",
      `this request costs at most ${price.amount} of token ${model.creditToken}: pay with x402 (PAYMENT-SIGNATURE) or send an API key`,
    );
  let payment: UptoPayment;
  try {
    payment = await checkPayment(paying.payload as never, {
      terms: x402.terms,
      price,
      now,
      minValiditySeconds: x402.minValiditySeconds,
      contractSigner: x402.contractSigner,
    });
  } catch (error) {
    if (error instanceof GatewayError) throw refuse(error.code, error.message);
    throw error;
  }
  // The offers this payment covers (the signed amount caps the request as a per-request cap).
  const candidates = ranked.filter((c) => c.maximumCredits <= payment.signedAmount);
  const counter = p.tokens.forModel(model);
  if (counter === undefined) throw modelLoading(req.model);
  const inputCount = await counter.countInput(req);
  const chosen = candidates[0]!;
  const permitId = x402PermitId(payment.payer, payment.nonce);
  const simulated = await x402.simulate(
    payment,
    chosen.maximumCredits,
    chosen.offer.offerId,
    permitId,
  );
  if (!simulated.ok) throw refuse(simulated.code, simulated.message);
  const opened = await x402.store.open({
    payment,
    permitId,
    maximum: chosen.maximumCredits,
    now,
  });
  if (!opened.ok) throw refuse(opened.code, opened.message);
  let admission;
  try {
    admission = await admit(p, turn, {
      quote: undefined,
      model,
      permit: paymentPermit(payment, permitId, model),
      grants: [paymentGrant(payment, input.apiKeyId, permitId, now)],
      candidates,
      failover: req.offer === undefined,
      counter,
      inputCount,
      durable: true,
      receipt: x402.receipt,
    });
  } catch (error) {
    // Nothing was reserved: the signature may pay another try.
    await x402.store.release(permitId).catch(() => undefined);
    throw error;
  }
  await serve(p, admission, turn.out);
}

/** The payment as the permit the request is admitted on: opened for this request alone. */
function paymentPermit(payment: UptoPayment, permitId: Hex, model: ModelRecord): Permit {
  return {
    permitId,
    payer: payment.payer.toLowerCase() as Hex,
    modelId: model.modelId,
    offerId: undefined,
    deposit: payment.signedAmount,
    settled: 0n,
    expiresAt: Number(payment.deadline),
    state: "open",
    closableAt: undefined,
  };
}

/** The payer's signature as the authority it gives: this permit, at most the signed amount. */
function paymentGrant(
  payment: UptoPayment,
  apiKeyId: string,
  permitId: Hex,
  now: number,
): PermitAuthorization {
  return {
    id: "x402",
    apiKeyId,
    payer: payment.payer.toLowerCase() as Hex,
    permitId,
    expiresAt: Number(payment.deadline),
    issuedAt: now,
    totalCap: 0n,
    perRequestCap: payment.signedAmount,
    period: "",
    periodCap: 0n,
    warnAt: 0n,
    createdAt: now,
    revokedAt: null,
    revokedBy: null,
  };
}
