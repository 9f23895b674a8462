import { Type, type TProperties, type TSchema } from "@sinclair/typebox";
import { Address, component, Decimal, Hex32, OptionalNullable, UnixSeconds } from "./common.js";

/**
 * The EIP-712 request and answer bodies: the challenges a payer or an operator signs and the
 * requests that carry the signatures (camelCase, as wallets sign them).
 */

/** An integer JavaScript reads exactly (request members given in Unix seconds). */
const SafeInteger = Type.Integer({
  minimum: -Number.MAX_SAFE_INTEGER,
  maximum: Number.MAX_SAFE_INTEGER,
  title: "integer (Unix seconds)",
});

/** A 65-byte or EIP-2098 compact signature; a malformed one is 401 `invalid_signature`. */
const Signature = (description: string) =>
  Type.String({
    pattern: "^0x([0-9a-fA-F]{128}|[0-9a-fA-F]{130})$",
    title: "signature (0x followed by 128 or 130 hex digits)",
    description,
    "x-error-code": "invalid_signature",
  });

/** Hex members of a request: malformed is 400 `invalid_hex`, as the services say over RPC. */
const hexMember = <T extends TSchema>(schema: T, description?: string): T =>
  ({
    ...schema,
    "x-error-code": "invalid_hex",
    ...(description === undefined ? {} : { description }),
  }) as T;

/** A nonce a client chooses: 1 to 128 printable ASCII characters (the services read this). */
export const noncePattern = /^[\x20-\x7e]{1,128}$/;
/** An endpoint's bearer token: 1 to 4096 visible ASCII characters, no spaces. */
export const endpointTokenPattern = /^[\x21-\x7e]{1,4096}$/;

const Nonce = Type.String({
  pattern: noncePattern.source,
  title: "nonce of 1 to 128 printable ASCII characters",
});

const EndpointUrl = Type.String({
  format: "uri",
  maxLength: 2048,
  title: "absolute URL of at most 2048 characters",
  description: "the endpoint's URL (the gateway judges it: 400 endpoint_not_allowed)",
});

const EndpointToken = (description: string) =>
  OptionalNullable(
    Type.String({
      pattern: `^$|${endpointTokenPattern.source}`,
      title: "token of 1 to 4096 visible ASCII characters (empty: none)",
      description,
    }),
  );

// ---------------------------------------------------------------- typed data answers

export const TypedDataFields = component(
  "TypedDataFields",
  Type.Array(Type.Object({ name: Type.String(), type: Type.String() })),
);

export const Eip712Domain = component(
  "Eip712Domain",
  Type.Object({
    name: Type.Literal("Model Market Gateway"),
    version: Type.Literal("3"),
    chainId: Type.Integer({ minimum: 1 }),
    verifyingContract: Address,
  }),
);

/**
 * Wallet-ready typed data (eth_signTypedData_v4) whose primary type is `primary`; `structs` names
 * the further struct types its message uses, `domain` a domain other than {@link Eip712Domain}.
 */
export function typedData<M extends TProperties>(
  name: string,
  primary: string,
  message: M,
  options: { readonly structs?: readonly string[]; readonly domain?: TSchema } = {},
) {
  const structs = Object.fromEntries((options.structs ?? []).map((s) => [s, TypedDataFields]));
  return component(
    name,
    Type.Object({
      types: Type.Object({ EIP712Domain: TypedDataFields, [primary]: TypedDataFields, ...structs }),
      primaryType: Type.Literal(primary),
      domain: options.domain ?? Eip712Domain,
      message: Type.Object(message),
    }),
  );
}

export const RegistrationTypedData = typedData("TypedData", "RegisterEndpoint", {
  offerId: Hex32,
  operator: Address,
  endpointUrlHash: Hex32,
  endpointTokenHash: {
    ...Hex32,
    description:
      "keccak256(utf8(endpointToken)), or the zero bytes32 when the challenge names no token",
  } as TSchema,
  nonce: Type.String(),
  expiresAt: UnixSeconds,
});

export const AuthorizeKeyTypedData = typedData("AuthorizeKeyTypedData", "AuthorizeKey", {
  payer: Address,
  keyId: Type.String({ description: "the calling API key's public id" }),
  permitId: Hex32,
  expiresAt: UnixSeconds,
  issuedAt: { ...UnixSeconds, description: "when the gateway issued this challenge" } as TSchema,
  deployment: Type.String({ description: "the gateway deployment (GET /v1/gateway)" }),
  totalCap: {
    ...Decimal,
    description: "credits the key may spend through this authorization in all; 0: no cap",
  } as TSchema,
  perRequestCap: {
    ...Decimal,
    description: "credits one request may reserve through it; 0: no cap",
  } as TSchema,
  period: Type.String({
    description: 'the periodic cap\'s UTC calendar period: "day", "week", "month"; "": none',
  }),
  periodCap: { ...Decimal, description: "credits per period; 0: none" } as TSchema,
  warnAt: {
    ...Decimal,
    description:
      "the soft threshold: credits of use (the current period's with a periodic cap, else the total's) from which answers carry x_gateway.budget_warning; 0: none",
  } as TSchema,
  nonce: Type.String(),
});

export const RevokeKeyAuthorizationTypedData = typedData(
  "RevokeKeyAuthorizationTypedData",
  "RevokeKeyAuthorization",
  { payer: Address, authorizationId: Type.String() },
);

export const BindOfferKeyTypedData = typedData("BindOfferKeyTypedData", "BindOfferKey", {
  offerId: Hex32,
  operator: {
    ...Address,
    description: "the offer's operator as the chain names it now",
  } as TSchema,
  keyId: Type.String({ description: "the calling API key's public id" }),
  expiresAt: UnixSeconds,
  nonce: Type.String(),
  deployment: Type.String({ description: "the gateway deployment (GET /v1/gateway)" }),
});

// ---------------------------------------------------------------- requests

export const KeyBindingChallengeRequest = component(
  "KeyBindingChallengeRequest",
  Type.Object({
    expiresAt: OptionalNullable(SafeInteger, {
      description: "Unix seconds, in the future (default now + 30 days)",
    }),
  }),
);

export const BindKeyRequest = component(
  "BindKeyRequest",
  Type.Object(
    {
      expiresAt: SafeInteger,
      nonce: Nonce,
      signature: Signature("the offer operator's 65-byte or EIP-2098 compact signature"),
      deployment: Type.Optional(
        Type.String({
          maxLength: 128,
          description:
            "the gateway deployment the operator signed for; another than this one's: 403 wrong_deployment",
        }),
      ),
    },
    { description: "The challenge's expiresAt and nonce as signed, and the operator's signature" },
  ),
);

export const AuthorizationChallengeRequest = component(
  "AuthorizationChallengeRequest",
  Type.Object({
    payer: hexMember(Address),
    permitId: OptionalNullable(
      hexMember(Hex32, "one permit of the payer; absent or all zeros: every permit of the payer"),
    ),
    expiresAt: OptionalNullable(SafeInteger, {
      description:
        "Unix seconds, in the future (default now + 30 days), at most AUTHORIZATION_MAX_EXPIRY_SECONDS (default 90 days) away",
    }),
    totalCap: OptionalNullable(
      Type.String({
        pattern: "^(0|[1-9][0-9]{0,77})$",
        description:
          "total credits (the permit's smallest unit), a decimal string; absent or 0: no cap",
      }),
    ),
    perRequestCap: OptionalNullable(
      Type.String({
        pattern: "^(0|[1-9][0-9]{0,77})$",
        description:
          "credits per request (the permit's smallest unit), a decimal string; absent or 0: no cap",
      }),
    ),
    period: OptionalNullable(
      Type.Union(
        [Type.Literal(""), Type.Literal("day"), Type.Literal("week"), Type.Literal("month")],
        {
          description:
            "the periodic cap's period: a UTC calendar day, week (from Monday) or month; absent or empty: none",
        },
      ),
    ),
    periodCap: OptionalNullable(
      Type.String({
        pattern: "^(0|[1-9][0-9]{0,77})$",
        description:
          "credits per period (the permit's smallest unit), a decimal string; absent or 0: none",
      }),
    ),
    warnAt: OptionalNullable(
      Type.String({
        pattern: "^(0|[1-9][0-9]{0,77})$",
        description:
          "the soft threshold: credits of use (the current period's with a periodic cap, else the total's) from which answers carry x_gateway.budget_warning, at most that cap; absent or 0: none",
      }),
    ),
  }),
);

export const AuthorizeKeyRequest = component(
  "AuthorizeKeyRequest",
  Type.Object(
    {
      payer: hexMember(Address),
      permitId: hexMember(Hex32),
      expiresAt: SafeInteger,
      issuedAt: SafeInteger,
      deployment: OptionalNullable(
        Type.String({
          maxLength: 128,
          description: "as signed; absent: this gateway's (another's: 403 wrong_deployment)",
        }),
      ),
      totalCap: OptionalNullable(
        Type.String({
          pattern: "^(0|[1-9][0-9]{0,77})$",
          description:
            "credits (the permit's smallest unit), a decimal string; absent or 0: no cap",
        }),
      ),
      perRequestCap: OptionalNullable(
        Type.String({
          pattern: "^(0|[1-9][0-9]{0,77})$",
          description:
            "credits (the permit's smallest unit), a decimal string; absent or 0: no cap",
        }),
      ),
      period: OptionalNullable(
        Type.Union(
          [Type.Literal(""), Type.Literal("day"), Type.Literal("week"), Type.Literal("month")],
          {
            description:
              "the periodic cap's period: a UTC calendar day, week (from Monday) or month; absent or empty: none",
          },
        ),
      ),
      periodCap: OptionalNullable(
        Type.String({
          pattern: "^(0|[1-9][0-9]{0,77})$",
          description:
            "credits per period (the permit's smallest unit), a decimal string; absent or 0: none",
        }),
      ),
      warnAt: OptionalNullable(
        Type.String({
          pattern: "^(0|[1-9][0-9]{0,77})$",
          description: "as signed: the soft threshold in credits; absent or 0: none",
        }),
      ),
      nonce: Nonce,
      signature: Signature("the payer's 65-byte or EIP-2098 compact signature"),
    },
    { description: "The challenge's message fields as signed, and the payer's signature" },
  ),
);

export const RevokeBySignatureRequest = component(
  "RevokeBySignatureRequest",
  Type.Object({
    signature: Signature("the payer's signature over the revocation challenge"),
  }),
);

/** The deployment a payer signed for; another's is 403 `wrong_deployment`. */
const SignedDeployment = Type.String({
  minLength: 1,
  maxLength: 128,
  description:
    "as signed: the gateway deployment (GET /v1/gateway `deployment`); another's: 403 wrong_deployment",
});

export const ListPayerAuthorizationsRequest = component(
  "ListPayerAuthorizationsRequest",
  Type.Object(
    {
      deployment: SignedDeployment,
      expiresAt: {
        ...SafeInteger,
        description:
          "as signed: Unix seconds, in the future (past: 401 signature_expired), at most 10 minutes ahead",
      } as typeof SafeInteger,
      signature: Signature(
        "the payer's signature over ListAuthorizations(address payer, string deployment, uint64 expiresAt)",
      ),
      limit: OptionalNullable(Type.Integer({ minimum: 1, maximum: 100 }), {
        description: "authorizations per page, 1 to 100 (default 50)",
      }),
      startingAfter: OptionalNullable(
        Type.String({
          pattern: "^pauth_[0-9a-f]{24}$",
          description: "the last id of the previous page",
        }),
      ),
    },
    {
      description:
        "The payer's read token (no API key): its ListAuthorizations signature, in the gateway's EIP-712 domain, usable until expiresAt",
    },
  ),
);

export const RevokePayerAuthorizationsRequest = component(
  "RevokePayerAuthorizationsRequest",
  Type.Object(
    {
      deployment: SignedDeployment,
      keyId: OptionalNullable(
        Type.String({
          pattern: "^$|^key_[0-9a-f]{24}$",
          description: "as signed: an API key's public id; absent or empty: every key",
        }),
      ),
      permitId: OptionalNullable(
        hexMember(
          Hex32,
          "as signed; absent or all zeros: every authorization, whatever its permit",
        ),
      ),
      before: {
        ...SafeInteger,
        description:
          "as signed: Unix seconds; what was issued at or before it is revoked (at most a minute ahead of the gateway's clock)",
      } as typeof SafeInteger,
      signature: Signature(
        "the payer's signature over RevokeAuthorizations(address payer, string deployment, string keyId, bytes32 permitId, uint64 before)",
      ),
    },
    {
      description:
        "The payer's RevokeAuthorizations, signed in the gateway's EIP-712 domain (no API key). Neither keyId nor permitId: revoke all, which also voids every AuthorizeKey issued at or before `before` not yet submitted",
    },
  ),
);

export const ChallengeRequest = component(
  "ChallengeRequest",
  Type.Object({
    offerId: hexMember(Hex32),
    endpointUrl: EndpointUrl,
    nonce: OptionalNullable(
      Type.String({
        pattern: `^$|${noncePattern.source}`,
        title: "nonce of 1 to 128 printable ASCII characters",
        description: "absent or empty: a random Hex32 the gateway makes",
      }),
    ),
    expiresAt: OptionalNullable(SafeInteger, {
      description: "Unix seconds, at most 15 minutes ahead (default now + 10 min)",
    }),
    endpointToken: EndpointToken(
      "the bearer the registration will present (optional): only its hash (message.endpointTokenHash) enters the typed data; the token is neither kept nor returned",
    ),
  }),
);

export const RegisterRequest = component(
  "RegisterRequest",
  Type.Object({
    offerId: hexMember(Hex32),
    endpointUrl: EndpointUrl,
    nonce: Nonce,
    expiresAt: SafeInteger,
    signature: Signature("65-byte or EIP-2098 compact signature of the challenge"),
    endpointToken: EndpointToken(
      "the bearer the gateway presents to the endpoint (never returned); must be the token whose hash the signed challenge carries, and absent when it carries the zero hash (else 401 invalid_signature)",
    ),
  }),
);
