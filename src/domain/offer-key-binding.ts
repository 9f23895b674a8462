import { randomBytes } from "node:crypto";
import { getAddress, type Address, type Hex } from "viem";
import {
  challengeExpiry,
  newChallengeNonce,
  readChallengeNonce,
  readChallengeSignature,
  readExpiresAt,
} from "./challenge-window.js";
import { GatewayError } from "./errors.js";
import { isHex32, normalizeHex } from "./hex.js";
import {
  defaultAuthorizationLifetimeSeconds,
  gatewayTypedData,
  grantStatus,
  signable,
  type AuthorizationDomain,
} from "./permit-authorization/index.js";
import { parseRegistrationSignature } from "./registration/index.js";
import {
  verifyParsedSignature,
  type SignatureVerifier,
  type TypedDataField,
} from "./signatures.js";

/**
 * Who may read an offer's earnings (docs/decisions/settlement.md, "Provider earnings"): the settlement
 * operator, and API keys the offer's operator bound to the offer. The operator signs
 * `BindOfferKey` typed data naming the key's public id, in the domain every gateway signature
 * uses; the gateway verifies it against the operator the chain names now (ECDSA, or ERC-1271
 * for a contract operator) and keeps the binding. The binding is worth something only while its
 * signer is still the offer's operator: a former operator's keys lose access with the change.
 */

// ------------------------------------------------------------------------------ typed data

export const bindOfferKeyFields: TypedDataField[] = [
  { name: "offerId", type: "bytes32" },
  { name: "operator", type: "address" },
  { name: "keyId", type: "string" },
  { name: "expiresAt", type: "uint64" },
  { name: "nonce", type: "string" },
  { name: "deployment", type: "string" },
];

// A type alias, not an interface: a message must be assignable to the verifier's record type.
export type BindOfferKeyMessage = {
  offerId: Hex;
  operator: Address;
  keyId: string;
  /** Unix seconds (a JSON number: wallets read uint64 from numbers). */
  expiresAt: number;
  nonce: string;
  /** The gateway deployment (GET /v1/gateway `deployment`): a binding does not replay elsewhere. */
  deployment: string;
};

/** Wallet-ready JSON (`eth_signTypedData_v4` wants `EIP712Domain` listed). */
export interface BindOfferKeyTypedData {
  types: { EIP712Domain: TypedDataField[]; BindOfferKey: TypedDataField[] };
  primaryType: "BindOfferKey";
  domain: AuthorizationDomain;
  message: BindOfferKeyMessage;
}

export function buildBindOfferKeyTypedData(args: {
  chainId: number;
  market: Address;
  message: BindOfferKeyMessage;
}): BindOfferKeyTypedData {
  return gatewayTypedData("BindOfferKey", bindOfferKeyFields, args, args.message);
}

// ------------------------------------------------------------------------------ bindings

export type KeyBindingStatus = "active" | "expired" | "revoked";

/** One API key's right to read one offer's earnings. Hex values are lower-case. */
export interface OfferKeyBinding {
  readonly id: string;
  readonly offerId: Hex;
  readonly apiKeyId: string;
  /** The operator who signed it. */
  readonly operator: Hex;
  /** Unix seconds. */
  readonly expiresAt: number;
  /** Unix seconds. */
  readonly createdAt: number;
  /** Unix seconds; null while not revoked. */
  readonly revokedAt: number | null;
}

export function keyBindingStatus(b: OfferKeyBinding, now: number): KeyBindingStatus {
  return grantStatus(b, now);
}

/** The table of bindings (adapters/pg/offer-key-bindings.ts). */
export interface OfferKeyBindingStore {
  /** Stores a binding with its proof; a second use of (operator, nonce) stores nothing. */
  insert(
    b: OfferKeyBinding,
    proof: { nonce: string; signature: Hex },
  ): Promise<"inserted" | "nonce_used">;
  /** Marks it revoked at `now` unless it already is; undefined when the key holds no such binding. */
  revoke(args: {
    id: string;
    offerId: Hex;
    apiKeyId: string;
    now: number;
  }): Promise<OfferKeyBinding | undefined>;
  /** The key's bindings to the offer that are neither revoked nor expired at `now`. */
  active(apiKeyId: string, offerId: Hex, now: number): Promise<OfferKeyBinding[]>;
  /** The key's bindings, to any offer, neither revoked nor expired at `now`; newest first. */
  activeOfKey(apiKeyId: string, now: number): Promise<OfferKeyBinding[]>;
}

/** Who asks for an offer's earnings. */
export type EarningsReader =
  | { readonly kind: "settlement_operator" }
  | { readonly kind: "api_key"; readonly apiKeyId: string };

/**
 * Refuses (403 `not_offer_operator`) a reader who may not see the offer's earnings: anyone but
 * the settlement operator and a key bound by `operator`, the offer's operator now.
 */
export async function requireEarningsReader(
  store: OfferKeyBindingStore,
  reader: EarningsReader,
  offer: { offerId: Hex; operator: Hex },
  now: number,
): Promise<void> {
  if (reader.kind === "settlement_operator") return;
  const bindings = await stored(() => store.active(reader.apiKeyId, offer.offerId, now));
  const operator = offer.operator.toLowerCase();
  if (bindings.some((b) => b.operator === operator)) return;
  throw new GatewayError(
    "not_offer_operator",
    `the operator of offer ${offer.offerId} has not bound this API key to it ` +
      "(POST /v1/provider-offers/{id}/key-bindings/challenge, signed by the operator)",
  );
}

// ------------------------------------------------------------------------------ service

export interface OfferKeyBindingServiceDeps {
  chainId: number;
  market: Address;
  /** This gateway's deployment id (GET /v1/gateway), named in every BindOfferKey. */
  deployment: string;
  /** The offer's operator as the chain names it now; undefined when there is no such offer. */
  operatorOf: (offerId: Hex) => Promise<Address | undefined>;
  store: OfferKeyBindingStore;
  verifier: SignatureVerifier;
  /** Unix seconds. */
  clock: () => number;
}

export interface OfferKeyBindingService {
  createChallenge(req: {
    apiKeyId: string;
    offerId: string;
    expiresAt?: number | bigint;
  }): Promise<BindOfferKeyTypedData>;
  bind(req: {
    apiKeyId: string;
    offerId: string;
    expiresAt: number | bigint;
    nonce: string;
    signature: string;
    /** The deployment the operator signed for, when the caller says; another: `wrong_deployment`. */
    deployment?: string;
  }): Promise<OfferKeyBinding>;
  /** Revocation by the key that holds it. */
  revoke(req: { apiKeyId: string; offerId: string; id: string }): Promise<OfferKeyBinding>;
  /** The key's active bindings (the offers whose earnings it may read), newest first. */
  list(req: { apiKeyId: string }): Promise<OfferKeyBinding[]>;
}

const bindingIdShape = /^okb_[0-9a-f]{24}$/;

export function createOfferKeyBindingService(
  deps: OfferKeyBindingServiceDeps,
): OfferKeyBindingService {
  const now = (): number => Math.floor(deps.clock());

  const operatorOf = async (offerId: Hex): Promise<Address> => {
    let operator: Address | undefined;
    try {
      operator = await deps.operatorOf(offerId);
    } catch (err) {
      if (err instanceof GatewayError) throw err;
      throw new GatewayError("chain_unavailable", "the market could not be read", { cause: err });
    }
    if (operator === undefined)
      throw new GatewayError("offer_not_found", `offer ${offerId} does not exist on chain`);
    return getAddress(operator);
  };

  return {
    async createChallenge(req) {
      const offerId = readOfferId(req.offerId);
      const t = now();
      const expiresAt = challengeExpiry(
        req.expiresAt,
        t,
        defaultAuthorizationLifetimeSeconds,
        (value) => readExpiresAt(value, t),
      );
      return buildBindOfferKeyTypedData({
        chainId: deps.chainId,
        market: deps.market,
        message: {
          offerId,
          operator: await operatorOf(offerId),
          keyId: req.apiKeyId,
          expiresAt,
          nonce: newChallengeNonce(),
          deployment: deps.deployment,
        },
      });
    },

    async bind(req) {
      const offerId = readOfferId(req.offerId);
      const t = now();
      if (req.deployment !== undefined && req.deployment !== deps.deployment) {
        throw new GatewayError(
          "wrong_deployment",
          `this binding was signed for gateway deployment ${req.deployment.slice(0, 80)}; ` +
            `this is ${deps.deployment} (GET /v1/gateway)`,
        );
      }
      const expiresAt = readExpiresAt(req.expiresAt, t);
      readChallengeNonce(req.nonce);
      const parsed = parseRegistrationSignature(readChallengeSignature(req.signature));
      // The operator is the chain's now and the key id the caller's, never the body's: a
      // signature by anyone else, or made for another key or offer, does not verify.
      const operator = await operatorOf(offerId);
      const typedData = buildBindOfferKeyTypedData({
        chainId: deps.chainId,
        market: deps.market,
        message: {
          offerId,
          operator,
          keyId: req.apiKeyId,
          expiresAt,
          nonce: req.nonce,
          deployment: deps.deployment,
        },
      });
      let valid: boolean;
      try {
        valid = await verifyParsedSignature(deps.verifier, operator, signable(typedData), parsed);
      } catch (err) {
        if (err instanceof GatewayError) throw err;
        throw new GatewayError("chain_unavailable", "the signature could not be checked", {
          cause: err,
        });
      }
      if (!valid) {
        // Altered fields and a wrong signer look the same to recovery; either way the
        // offer's operator did not sign this.
        throw new GatewayError(
          "invalid_signature",
          `the signature is not the offer's operator's (${operator})`,
        );
      }
      const binding: OfferKeyBinding = {
        id: `okb_${randomBytes(12).toString("hex")}`,
        offerId,
        apiKeyId: req.apiKeyId,
        operator: normalizeHex(operator),
        expiresAt,
        createdAt: t,
        revokedAt: null,
      };
      const outcome = await stored(() =>
        deps.store.insert(binding, { nonce: req.nonce, signature: parsed.compact ?? parsed.full }),
      );
      if (outcome === "nonce_used") {
        throw new GatewayError("nonce_used", "this binding nonce has already been used");
      }
      return binding;
    },

    async revoke(req) {
      const offerId = readOfferId(req.offerId);
      const revoked = bindingIdShape.test(req.id)
        ? await stored(() =>
            deps.store.revoke({ id: req.id, offerId, apiKeyId: req.apiKeyId, now: now() }),
          )
        : undefined;
      if (revoked === undefined) {
        throw new GatewayError(
          "binding_not_found",
          `this API key holds no binding ${req.id.slice(0, 64)} on offer ${offerId}`,
        );
      }
      return revoked;
    },

    async list(req) {
      return stored(() => deps.store.activeOfKey(req.apiKeyId, now()));
    },
  };
}

async function stored<T>(run: () => Promise<T>): Promise<T> {
  try {
    return await run();
  } catch (err) {
    if (err instanceof GatewayError) throw err;
    throw new GatewayError("database_unavailable", "the key binding store could not be reached", {
      cause: err,
    });
  }
}

/** A Hex32 offer id, lower-case; 400 `invalid_hex` otherwise. */
export function readOfferId(value: unknown): Hex {
  if (typeof value !== "string" || !isHex32(value)) {
    throw new GatewayError("invalid_hex", "offer id must be a Hex32 (0x + 64 hex digits)");
  }
  return normalizeHex(value);
}
