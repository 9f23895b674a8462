import type { Hex } from "viem";
import { GatewayError } from "./errors.js";
import type {
  EndpointSecret,
  HealthMonitorDeps,
  VerificationClaim,
  VerificationOutcome,
  VerificationRecord,
  VerificationSubject,
} from "./health-types.js";

/**
 * One verification run of an offer's endpoint (the health monitor's `verify` in
 * src/domain/health.ts shares and bounds the runs): claims the run in the store, runs the
 * prober's conformance checks, records and logs the outcome, or answers the last run's outcome
 * inside the bound.
 */

/** Runs a verification of `id` now, or answers the last run's outcome inside the bound. */
export async function runVerification(
  deps: HealthMonitorDeps,
  id: Hex,
  modelNames: readonly string[],
  ttlSeconds: number,
  subject: VerificationSubject | undefined,
): Promise<VerificationOutcome> {
  const { store, open, prober, clock, logger } = deps;
  const endpoint = await store.getRegisteredEndpoint(id);
  if (endpoint === undefined) {
    throw new GatewayError("offer_not_found", "the offer has no registered endpoint");
  }
  const minInterval = Math.max(0, deps.verifyMinIntervalSeconds);
  const claim = await store.claimVerification(id, endpoint.sealed, clock(), minInterval);
  if (claim === undefined) throw registeredAgain();
  const nextRunAt = claim.claimedAt + minInterval;
  if (!claim.claimed) return replay(claim, nextRunAt, clock());
  let secret: EndpointSecret;
  try {
    secret = open(endpoint.offerId, endpoint.sealed);
  } catch (err) {
    throw new GatewayError("internal_error", "the registered endpoint cannot be opened", {
      cause: err instanceof Error ? new Error(err.name) : undefined,
    });
  }
  const result = await prober.verifyEndpoint(secret, modelNames, subject);
  const now = clock();
  const record: VerificationRecord = result.ok
    ? {
        ok: true,
        verifiedAt: now,
        expiresAt: now + ttlSeconds,
        features: result.features,
        unanswered: result.unanswered,
      }
    : { ...result, ranAt: now };
  if (!(await store.recordVerification(id, record, endpoint.sealed))) throw registeredAgain();
  // A transport failure says the endpoint did not answer; any answer says it runs.
  const running = result.ok || !result.transport;
  await store.recordProbe(id, running, now);
  const common = { ranAt: now, replayed: false, nextRunAt };
  if (result.ok) {
    logger.info({ offerId: id, outcome: "verified" }, "verified provider endpoint");
    return {
      ...common,
      outcome: "verified",
      ok: true,
      verifiedAt: now,
      expiresAt: now + ttlSeconds,
    };
  }
  if (result.transport) {
    // Recorded (last_verification_*) and logged; the standing verification is untouched.
    logger.warn(
      {
        offerId: id,
        outcome: "unreachable",
        check: result.check,
        reason: result.message,
        verifiedAt: claim.verifiedAt,
        verificationExpiresAt: claim.verificationExpiresAt,
      },
      "verification of a provider endpoint got no answer; its standing verification is kept",
    );
    return {
      ...common,
      outcome: "unreachable",
      ok: false,
      check: result.check,
      message: result.message,
      verifiedAt: claim.verifiedAt,
      expiresAt: claim.verificationExpiresAt,
    };
  }
  logger.info(
    { offerId: id, outcome: "rejected", check: result.check },
    "verified provider endpoint",
  );
  return {
    ...common,
    outcome: "rejected",
    ok: false,
    check: result.check,
    message: result.message,
    verifiedAt: undefined,
    expiresAt: undefined,
  };
}

/** The stored outcome of the last run, answered to a caller inside the bound. */
function replay(claim: VerificationClaim, nextRunAt: number, now: number): VerificationOutcome {
  const last = claim.last;
  if (last === undefined) {
    // The endpoint's first run is under way in another gateway: nothing to answer yet.
    throw new GatewayError(
      "rate_limited",
      `a verification of this offer started at ${claim.claimedAt} and has not ended yet; its outcome is answered once it has`,
      { retryAfterSeconds: Math.max(1, nextRunAt - now) },
    );
  }
  const common = {
    ranAt: last.ranAt,
    replayed: true,
    nextRunAt,
    verifiedAt: claim.verifiedAt,
    expiresAt: claim.verificationExpiresAt,
  };
  if (last.outcome === "verified") return { ...common, outcome: "verified", ok: true };
  return {
    ...common,
    outcome: last.outcome,
    ok: false,
    check: last.check ?? "endpoint_unreachable",
    message: last.message ?? "the last verification failed",
  };
}

function registeredAgain(): GatewayError {
  return new GatewayError(
    "upstream_unavailable",
    "the endpoint was registered again during verification; verify again",
  );
}
