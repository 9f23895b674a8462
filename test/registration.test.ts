import { randomBytes } from "node:crypto";
import { httpStatusOf } from "../src/connect/error-codes.js";
import { Wallet } from "ethers";
import pg from "pg";
import { pino } from "pino";
import {
  keccak256,
  parseSignature,
  serializeCompactSignature,
  signatureToCompactSignature,
  stringToHex,
  type Address,
  type Hex,
} from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startAnvil, type AnvilAccount, type AnvilInstance } from "../src/adapters/chain/anvil.js";
import { marketAbi } from "../gen/contracts/artifacts.js";
import { chainClients, type ChainClients } from "../src/adapters/chain/clients.js";
import { deployErc1271Wallet } from "../src/adapters/chain/deploy.js";
import { createIndexer } from "../src/adapters/chain/indexer.js";
import { createChainOfferReader } from "../src/adapters/chain/offers.js";
import { createSealer, generateEncryptionKey } from "../src/adapters/crypto/sealer.js";
import {
  getProviderEndpoint,
  pruneExpiredNonces,
  recordRegistration,
} from "../src/adapters/pg/registrations.js";
import {
  demoAccounts,
  demoMetadata,
  demoTariff,
  id32,
  seedDemoMarket,
  type DemoAccounts,
  type DemoMarket,
} from "../src/dev/demo-market.js";
import { GatewayError, type ErrorCode } from "../src/domain/errors.js";
import {
  createRegistrationService,
  openEndpoint,
  withoutDomainType,
  type RegisterRequest,
  type RegistrationService,
  type RegistrationServiceDeps,
  type RegistrationTypedData,
} from "../src/domain/registration/index.js";
import { createTestDatabase, describeIfPostgres, type TestDatabase } from "./helpers/db.js";

const secp256k1N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;

/** Stand-in for the lead's URL canonicaliser: absolute http(s), WHATWG-normalised. */
function canonicalizeUrl(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new GatewayError("invalid_request", "endpointUrl must be an absolute URL");
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new GatewayError("invalid_request", "endpointUrl must be http or https");
  }
  return parsed.href;
}

/** Stand-in for the lead's endpoint policy: refuses 10.x and 169.254.x hosts. */
async function checkEndpoint(canonicalUrl: string): Promise<void> {
  const host = new URL(canonicalUrl).hostname;
  // Deliberately leaky message: the service must scrub it.
  if (/^(10|169\.254)\./.test(host)) {
    throw new GatewayError("endpoint_not_allowed", `endpoint ${canonicalUrl} is not allowed`);
  }
}

const now = (): number => Math.floor(Date.now() / 1000);

/** Every error message a test saw; none may contain an endpoint URL or token. */
const seenMessages: string[] = [];
const usedSecrets: string[] = [];

async function expectCode(promise: Promise<unknown>, code: ErrorCode): Promise<GatewayError> {
  let error: unknown;
  try {
    await promise;
  } catch (err) {
    error = err;
  }
  expect(error, `expected ${code}`).toBeInstanceOf(GatewayError);
  const gatewayError = error as GatewayError;
  seenMessages.push(gatewayError.message, String(gatewayError.cause ?? ""));
  expect(gatewayError.code, gatewayError.message).toBe(code);
  return gatewayError;
}

function uniqueUrl(label: string): string {
  const url = `https://${label}-${randomBytes(4).toString("hex")}.provider.example:8443/v1/`;
  usedSecrets.push(url);
  return url;
}

function token(): string {
  const t = `tok_${randomBytes(12).toString("hex")}`;
  usedSecrets.push(t);
  return t;
}

async function rpc<T>(url: string, method: string, params: unknown[]): Promise<T> {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }),
  });
  const body = (await res.json()) as { result?: T; error?: { message: string } };
  if (body.error) throw new Error(`${method}: ${body.error.message}`);
  return body.result as T;
}

function toCompact(signature: Hex): Hex {
  return serializeCompactSignature(signatureToCompactSignature(parseSignature(signature)));
}

describe("provider registration (anvil + database)", () => {
  let anvil: AnvilInstance;
  let clients: ChainClients;
  let roles: DemoAccounts;
  let demo: DemoMarket;
  let database: TestDatabase;
  let deps: RegistrationServiceDeps;
  let service: RegistrationService;
  let offerId: Hex;
  let stranger: AnvilAccount;
  let walletOwner: AnvilAccount;
  let walletAddress: Address;
  const walletOfferId = id32("offer:erc1271-wallet");
  const sealer = createSealer(generateEncryptionKey());

  const sync = async (): Promise<void> => {
    const indexer = createIndexer({
      client: clients.publicClient,
      market: demo.market,
      pool: database.db.pool,
      confirmations: 0,
      startBlock: demo.deployBlock,
      pollIntervalMs: 100,
      logger: pino({ level: "silent" }),
    });
    while ((await indexer.syncOnce())?.behind) {
      // keep going until the head
    }
  };

  const createOffer = async (id: Hex, operator: Address, owner: AnvilAccount): Promise<void> => {
    const wallet = clients.wallet(owner.privateKey);
    const hash = await wallet.writeContract({
      address: demo.market,
      abi: marketAbi,
      functionName: "createOffer",
      args: [
        id,
        demo.models[0]!.modelId,
        operator,
        owner.address,
        demoTariff,
        demoMetadata("eu", "cpu"),
      ],
    });
    const receipt = await clients.publicClient.waitForTransactionReceipt({ hash });
    expect(receipt.status).toBe("success");
  };

  /** Challenge -> sign with `sign` -> the registration request (not yet sent). */
  const signedRequest = async (
    offer: Hex,
    sign: (td: RegistrationTypedData) => Promise<Hex>,
    extra: { nonce?: string; expiresAt?: number; endpointToken?: string } = {},
  ): Promise<{ req: RegisterRequest; typedData: RegistrationTypedData }> => {
    const endpointUrl = uniqueUrl("p");
    const typedData = await service.createChallenge({
      offerId: offer,
      endpointUrl,
      ...(extra.nonce === undefined ? {} : { nonce: extra.nonce }),
      ...(extra.expiresAt === undefined ? {} : { expiresAt: extra.expiresAt }),
      ...(extra.endpointToken === undefined ? {} : { endpointToken: extra.endpointToken }),
    });
    const signature = await sign(typedData);
    return {
      typedData,
      req: {
        offerId: offer,
        endpointUrl,
        nonce: typedData.message.nonce,
        expiresAt: typedData.message.expiresAt,
        signature,
        ...(extra.endpointToken === undefined ? {} : { endpointToken: extra.endpointToken }),
      },
    };
  };

  const viemSigner =
    (account: AnvilAccount) =>
    (td: RegistrationTypedData): Promise<Hex> =>
      privateKeyToAccount(account.privateKey).signTypedData(withoutDomainType(td));

  beforeAll(async () => {
    anvil = await startAnvil();
    clients = chainClients(anvil.chainId, anvil.rpcUrl, 50);
    roles = demoAccounts(anvil.accounts);
    demo = await seedDemoMarket(clients, roles);
    stranger = anvil.accounts[5]!;
    walletOwner = anvil.accounts[6]!;
    walletAddress = await deployErc1271Wallet(
      clients.wallet(roles.deployer.privateKey),
      clients.publicClient,
      {
        owner: walletOwner.address,
      },
    );
    // The offer owner is any account; the operator is the contract wallet.
    await createOffer(walletOfferId, walletAddress, roles.creator);
    database = await createTestDatabase();
    await sync();
    offerId = demo.offers[0]!.offerId;
    deps = {
      chainId: anvil.chainId,
      market: demo.market,
      offers: createChainOfferReader({ client: clients.publicClient, market: demo.market }),
      recordRegistration: (nonce, reg) => recordRegistration(database.db.pool, nonce, reg),
      sealer,
      canonicalizeUrl,
      checkEndpoint,
      clock: now,
      challengeSecret: randomBytes(32),
    };
    service = createRegistrationService(deps);
  });

  afterAll(async () => {
    await database?.drop();
    await anvil?.stop();
  });

  describe("challenge", () => {
    it("is wallet-ready EIP-712 JSON naming the chain's operator", async () => {
      const endpointUrl = uniqueUrl("challenge");
      const t = now();
      const td = await service.createChallenge({
        offerId: offerId.toUpperCase().replace("0X", "0x"),
        endpointUrl,
      });
      expect(JSON.parse(JSON.stringify(td))).toEqual(td);
      expect(td.primaryType).toBe("RegisterEndpoint");
      expect(td.domain).toEqual({
        name: "Model Market Gateway",
        version: "3",
        chainId: anvil.chainId,
        verifyingContract: demo.market,
      });
      expect(td.types.EIP712Domain.map((f) => f.name)).toEqual([
        "name",
        "version",
        "chainId",
        "verifyingContract",
      ]);
      expect(td.types.RegisterEndpoint).toEqual([
        { name: "offerId", type: "bytes32" },
        { name: "operator", type: "address" },
        { name: "endpointUrlHash", type: "bytes32" },
        { name: "endpointTokenHash", type: "bytes32" },
        { name: "nonce", type: "string" },
        { name: "expiresAt", type: "uint64" },
      ]);
      expect(td.message.offerId).toBe(offerId.toLowerCase());
      // No token named: the zero bytes32.
      expect(td.message.endpointTokenHash).toBe(`0x${"00".repeat(32)}`);
      expect(td.message.operator.toLowerCase()).toBe(roles.operator.address.toLowerCase());
      expect(td.message.nonce).toMatch(/^0x[0-9a-f]{64}$/);
      expect(td.message.expiresAt - t).toBeGreaterThanOrEqual(599);
      expect(td.message.expiresAt - t).toBeLessThanOrEqual(601);
      expect(JSON.stringify(td)).not.toContain(endpointUrl);
    });

    it("keeps a caller's nonce and expiry", async () => {
      const expiresAt = now() + 120;
      const td = await service.createChallenge({
        offerId,
        endpointUrl: uniqueUrl("own"),
        nonce: "my nonce 1",
        expiresAt,
      });
      expect(td.message.nonce).toBe("my nonce 1");
      expect(td.message.expiresAt).toBe(expiresAt);
    });

    it("validates its fields", async () => {
      const endpointUrl = uniqueUrl("v");
      await expectCode(service.createChallenge({ offerId: "0x1234", endpointUrl }), "invalid_hex");
      await expectCode(service.createChallenge({ offerId, endpointUrl: "" }), "invalid_request");
      await expectCode(
        service.createChallenge({ offerId, endpointUrl: "ftp://x.example/" }),
        "invalid_request",
      );
      await expectCode(
        service.createChallenge({ offerId, endpointUrl, nonce: "x".repeat(129) }),
        "invalid_request",
      );
      await expectCode(
        service.createChallenge({ offerId, endpointUrl, nonce: "tab\there" }),
        "invalid_request",
      );
      await expectCode(
        service.createChallenge({ offerId, endpointUrl, expiresAt: 1.5 }),
        "invalid_request",
      );
      await expectCode(
        service.createChallenge({ offerId, endpointUrl, expiresAt: now() - 1 }),
        "challenge_expiry_invalid",
      );
      await expectCode(
        service.createChallenge({ offerId, endpointUrl, expiresAt: now() }),
        "challenge_expiry_invalid",
      );
      await expectCode(
        service.createChallenge({ offerId, endpointUrl, expiresAt: now() + 901 }),
        "challenge_expiry_invalid",
      );
      const edge = await service.createChallenge({ offerId, endpointUrl, expiresAt: now() + 899 });
      expect(edge.message.expiresAt).toBeGreaterThan(now());
    });

    it("answers offer_not_found for an offer the chain does not know", async () => {
      await expectCode(
        service.createChallenge({ offerId: id32("offer:nobody"), endpointUrl: uniqueUrl("nf") }),
        "offer_not_found",
      );
    });
  });

  describe("register", () => {
    it("accepts a challenge signed by ethers v6 Wallet.signTypedData and stores it sealed", async () => {
      const endpointToken = token();
      const wallet = new Wallet(roles.operator.privateKey);
      const { req } = await signedRequest(
        offerId,
        async (td) => {
          const s = withoutDomainType(td);
          return (await wallet.signTypedData(s.domain, s.types, s.message)) as Hex;
        },
        { endpointToken },
      );
      expect(await service.register(req)).toBe(offerId.toLowerCase());

      const row = await getProviderEndpoint(database.db.pool, offerId);
      expect(row).toMatchObject({
        offerId: offerId.toLowerCase(),
        operator: roles.operator.address.toLowerCase(),
        verifiedAt: null,
        verificationExpiresAt: null,
        running: null,
      });
      const raw = row!.endpointSealed.toString("latin1");
      expect(raw).not.toContain(req.endpointUrl);
      expect(raw).not.toContain(endpointToken);
      expect(openEndpoint(sealer, offerId, row!.endpointSealed)).toEqual({
        url: canonicalizeUrl(req.endpointUrl),
        token: endpointToken,
      });
      const nonces = await database.db.pool.query(
        "SELECT offer_id, operator, expires_at FROM registration_nonces WHERE nonce = $1",
        [req.nonce],
      );
      expect(nonces.rows).toEqual([
        {
          offer_id: offerId.toLowerCase(),
          operator: roles.operator.address.toLowerCase(),
          expires_at: String(req.expiresAt),
        },
      ]);
    });

    it("refuses a signed payload replayed with another endpoint token (or none) with invalid_signature; the right token registers", async () => {
      const endpointToken = token();
      const { req, typedData } = await signedRequest(offerId, viemSigner(roles.operator), {
        endpointToken,
      });
      expect(typedData.message.endpointTokenHash).toBe(keccak256(stringToHex(endpointToken)));
      expect(JSON.stringify(typedData)).not.toContain(endpointToken);
      const before = await getProviderEndpoint(database.db.pool, offerId);
      // Whoever copies the signed payload cannot register their own token with it...
      const attacker = token();
      const swapped = await expectCode(
        service.register({ ...req, endpointToken: attacker }),
        "invalid_signature",
      );
      expect(swapped.message).not.toContain(attacker);
      // ...nor register the endpoint without a token, nor with the token in another case.
      const { endpointToken: _, ...bare } = req;
      await expectCode(service.register(bare), "invalid_signature");
      await expectCode(
        service.register({ ...req, endpointToken: endpointToken.toUpperCase() }),
        "invalid_signature",
      );
      // The refusals spent no nonce and changed no endpoint.
      expect(await getProviderEndpoint(database.db.pool, offerId)).toEqual(before);
      expect(
        (
          await database.db.pool.query("SELECT 1 FROM registration_nonces WHERE nonce = $1", [
            req.nonce,
          ])
        ).rows,
      ).toEqual([]);

      expect(await service.register(req)).toBe(offerId.toLowerCase());
      const row = await getProviderEndpoint(database.db.pool, offerId);
      expect(openEndpoint(sealer, offerId, row!.endpointSealed)).toEqual({
        url: canonicalizeUrl(req.endpointUrl),
        token: endpointToken,
      });

      // A challenge made without a token registers none, and cannot be given one.
      const none = await signedRequest(offerId, viemSigner(roles.operator));
      await expectCode(
        service.register({ ...none.req, endpointToken: token() }),
        "invalid_signature",
      );
      expect(await service.register(none.req)).toBe(offerId.toLowerCase());
      const untokened = await getProviderEndpoint(database.db.pool, offerId);
      expect(openEndpoint(sealer, offerId, untokened!.endpointSealed)).toEqual({
        url: canonicalizeUrl(none.req.endpointUrl),
      });
    });

    it("accepts the wallet JSON as is through eth_signTypedData_v4", async () => {
      // anvil signs for its unlocked dev accounts, as a browser wallet would for its user.
      const { req } = await signedRequest(offerId, (td) =>
        rpc<Hex>(anvil.rpcUrl, "eth_signTypedData_v4", [roles.operator.address, td]),
      );
      expect(await service.register(req)).toBe(offerId.toLowerCase());
    });

    it("accepts a viem account's 65-byte signature and its EIP-2098 compact form", async () => {
      const { req } = await signedRequest(offerId, viemSigner(roles.operator));
      expect(req.signature.length).toBe(132);
      expect(await service.register(req)).toBe(offerId.toLowerCase());

      const compact = await signedRequest(offerId, async (td) =>
        toCompact(await viemSigner(roles.operator)(td)),
      );
      expect(compact.req.signature.length).toBe(130);
      expect(await service.register(compact.req)).toBe(offerId.toLowerCase());
    });

    it("accepts v as 0/1 as well as 27/28", async () => {
      const { req } = await signedRequest(offerId, async (td) => {
        const sig = await viemSigner(roles.operator)(td);
        const v = Number.parseInt(sig.slice(130), 16) - 27;
        return `${sig.slice(0, 130)}0${v}` as Hex;
      });
      expect(await service.register(req)).toBe(offerId.toLowerCase());
    });

    it("accepts an ERC-1271 contract operator, 65-byte and compact", async () => {
      const td = await service.createChallenge({
        offerId: walletOfferId,
        endpointUrl: uniqueUrl("w"),
      });
      expect(td.message.operator.toLowerCase()).toBe(walletAddress.toLowerCase());
      const endpointToken = token();
      const { req } = await signedRequest(walletOfferId, viemSigner(walletOwner), {
        endpointToken,
      });
      // The contract wallet's signature binds the token as an account's does.
      await expectCode(service.register({ ...req, endpointToken: token() }), "invalid_signature");
      expect(await service.register(req)).toBe(walletOfferId);
      expect(
        openEndpoint(
          sealer,
          walletOfferId,
          (await getProviderEndpoint(database.db.pool, walletOfferId))!.endpointSealed,
        ).token,
      ).toBe(endpointToken);
      const compact = await signedRequest(walletOfferId, async (t) =>
        toCompact(await viemSigner(walletOwner)(t)),
      );
      expect(await service.register(compact.req)).toBe(walletOfferId);
      const row = await getProviderEndpoint(database.db.pool, walletOfferId);
      expect(row?.operator).toBe(walletAddress.toLowerCase());
    });

    it("answers 403 not_offer_operator to another key's valid signature over the issued fields", async () => {
      const { req } = await signedRequest(offerId, viemSigner(stranger));
      const err = await expectCode(service.register(req), "not_offer_operator");
      expect(httpStatusOf(err.code)).toBe(403);
      expect(err.message).toContain(stranger.address);
      // The contract wallet refuses a key that is not its owner's.
      const wallet = await signedRequest(walletOfferId, viemSigner(stranger));
      await expectCode(service.register(wallet.req), "not_offer_operator");
      // A caller-chosen nonce: the signature is well formed and not the operator's.
      const own = await signedRequest(offerId, viemSigner(stranger), { nonce: "caller-nonce-1" });
      await expectCode(service.register(own.req), "not_offer_operator");
    });

    it("answers 401 invalid_signature when the URL, nonce or expiry differ from what was signed", async () => {
      const sign = viemSigner(roles.operator);
      const url = await signedRequest(offerId, sign);
      const e1 = await expectCode(
        service.register({ ...url.req, endpointUrl: uniqueUrl("tampered") }),
        "invalid_signature",
      );
      expect(httpStatusOf(e1.code)).toBe(401);

      const nonce = await signedRequest(offerId, sign);
      const flipped = nonce.req.nonce.endsWith("0") ? "1" : "0";
      await expectCode(
        service.register({ ...nonce.req, nonce: nonce.req.nonce.slice(0, -1) + flipped }),
        "invalid_signature",
      );
      await expectCode(
        service.register({
          ...nonce.req,
          nonce: nonce.req.nonce.toUpperCase().replace("0X", "0x"),
        }),
        "invalid_signature",
      );

      const expiry = await signedRequest(offerId, sign);
      await expectCode(
        service.register({ ...expiry.req, expiresAt: Number(expiry.req.expiresAt) + 1 }),
        "invalid_signature",
      );

      // The same for a contract operator.
      const wallet = await signedRequest(walletOfferId, viemSigner(walletOwner));
      await expectCode(
        service.register({ ...wallet.req, endpointUrl: uniqueUrl("tampered") }),
        "invalid_signature",
      );

      // Nothing was consumed: the untampered request still registers.
      expect(await service.register(url.req)).toBe(offerId.toLowerCase());
    });

    it("refuses a high-s signature and malformed ones with invalid_signature", async () => {
      const { req } = await signedRequest(offerId, viemSigner(roles.operator));
      const sig = parseSignature(req.signature as Hex);
      const highS = secp256k1N - BigInt(sig.s);
      const flippedV = sig.yParity === 0 ? "1c" : "1b";
      const malleable = `${sig.r}${highS.toString(16).padStart(64, "0")}${flippedV}` as Hex;
      const err = await expectCode(
        service.register({ ...req, signature: malleable }),
        "invalid_signature",
      );
      expect(err.message).toMatch(/canonical/);
      for (const bad of [
        "0x1234",
        `${req.signature}00`,
        req.signature.slice(2),
        `${req.signature.slice(0, 130)}1d`,
        `0x${"00".repeat(65)}`,
      ]) {
        await expectCode(service.register({ ...req, signature: bad }), "invalid_signature");
      }
      await expectCode(service.register({ ...req, signature: "" }), "invalid_request");
      // The low-s original still works: no nonce was spent on the refusals.
      expect(await service.register(req)).toBe(offerId.toLowerCase());
    });

    it("answers 409 nonce_used to a reused nonce and clears verification on re-registration", async () => {
      const { req } = await signedRequest(offerId, viemSigner(roles.operator));
      await service.register(req);
      await database.db.pool.query(
        "UPDATE provider_endpoints SET verified_at = 1, verification_expires_at = 2, verification_error = 'x', running = true, checked_at = 3 WHERE offer_id = $1",
        [offerId.toLowerCase()],
      );
      const err = await expectCode(service.register(req), "nonce_used");
      expect(httpStatusOf(err.code)).toBe(409);
      // The refused replay changed nothing.
      expect((await getProviderEndpoint(database.db.pool, offerId))?.verifiedAt).toBe(1);

      const next = await signedRequest(offerId, viemSigner(roles.operator));
      await service.register(next.req);
      expect(await getProviderEndpoint(database.db.pool, offerId)).toMatchObject({
        verifiedAt: null,
        verificationExpiresAt: null,
        verificationError: null,
        running: null,
        checkedAt: null,
      });
    });

    it("prunes only nonces of expired challenges", async () => {
      const { rows } = await database.db.pool.query<{ count: string }>(
        "SELECT count(*) FROM registration_nonces",
      );
      expect(Number(rows[0]!.count)).toBeGreaterThan(0);
      expect(await pruneExpiredNonces(database.db.pool, now())).toBe(0);
      await database.db.pool.query(
        "INSERT INTO registration_nonces (nonce, offer_id, operator, expires_at) VALUES ('old', $1, $2, 1)",
        [offerId.toLowerCase(), roles.operator.address.toLowerCase()],
      );
      expect(await pruneExpiredNonces(database.db.pool, now())).toBe(1);
    });

    it("lets exactly one of two concurrent registrations with one nonce succeed", async () => {
      for (let round = 0; round < 3; round++) {
        const { req } = await signedRequest(offerId, viemSigner(roles.operator));
        const results = await Promise.allSettled([service.register(req), service.register(req)]);
        expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(1);
        const rejected = results.find((r) => r.status === "rejected");
        expect((rejected as PromiseRejectedResult).reason).toMatchObject({ code: "nonce_used" });
      }
    });

    it("answers challenge_expiry_invalid to a past or too distant expiry", async () => {
      const sign = viemSigner(roles.operator);
      const past = await signedRequest(offerId, sign, { expiresAt: now() + 2 });
      const late = createRegistrationService({ ...deps, clock: () => now() + 3 });
      await expectCode(late.register(past.req), "challenge_expiry_invalid");

      const far = await signedRequest(offerId, sign);
      await expectCode(
        service.register({ ...far.req, expiresAt: now() + 901 }),
        "challenge_expiry_invalid",
      );
      await expectCode(
        service.register({ ...far.req, expiresAt: now() - 10 }),
        "challenge_expiry_invalid",
      );
    });

    it("answers offer_not_found for an unknown offer, and for one the gateway has not indexed", async () => {
      const { req } = await signedRequest(offerId, viemSigner(roles.operator));
      const err = await expectCode(
        service.register({ ...req, offerId: id32("offer:unknown") }),
        "offer_not_found",
      );
      expect(httpStatusOf(err.code)).toBe(404);

      const fresh = id32("offer:not-indexed-yet");
      await createOffer(fresh, roles.operator.address, roles.operator);
      const unindexed = await signedRequest(fresh, viemSigner(roles.operator));
      await expectCode(service.register(unindexed.req), "offer_not_found");
      await sync();
      // The refusal did not spend the nonce.
      expect(await service.register(unindexed.req)).toBe(fresh);
    });

    it("verifies against the operator the chain names at registration", async () => {
      const id = id32("offer:operator-change");
      await createOffer(id, roles.operator.address, roles.creator);
      await sync();
      const { req } = await signedRequest(id, viemSigner(roles.operator));
      const owner = clients.wallet(roles.creator.privateKey);
      const hash = await owner.writeContract({
        address: demo.market,
        abi: marketAbi,
        functionName: "setOfferOperator",
        args: [id, stranger.address],
      });
      await clients.publicClient.waitForTransactionReceipt({ hash });
      await expectCode(service.register(req), "not_offer_operator");
      // The new operator registers with a challenge of its own (which names it).
      const fresh = await signedRequest(id, viemSigner(stranger));
      expect(fresh.typedData.message.operator).toBe(stranger.address);
      expect(await service.register(fresh.req)).toBe(id);
    });

    it("answers endpoint_not_allowed without echoing the URL", async () => {
      const { req } = await signedRequest(offerId, viemSigner(roles.operator));
      for (const endpointUrl of ["http://10.0.0.1:8000/v1", "http://169.254.169.254/latest/"]) {
        usedSecrets.push(endpointUrl);
        const err = await expectCode(
          service.register({ ...req, endpointUrl }),
          "endpoint_not_allowed",
        );
        expect(httpStatusOf(err.code)).toBe(400);
        expect(err.cause).toBeUndefined();
      }
    });

    it("validates its fields before anything else", async () => {
      const { req } = await signedRequest(offerId, viemSigner(roles.operator));
      const tok = token();
      await expectCode(service.register({ ...req, offerId: "nope" }), "invalid_hex");
      await expectCode(service.register({ ...req, endpointUrl: " " }), "invalid_request");
      await expectCode(service.register({ ...req, nonce: "" }), "invalid_request");
      await expectCode(service.register({ ...req, expiresAt: "soon" }), "invalid_request");
      await expectCode(
        service.register({ ...req, endpointToken: `${tok}\r\nx: y` }),
        "invalid_request",
      );
      await expectCode(
        service.register({ ...req, endpointToken: `has space ${tok}` }),
        "invalid_request",
      );
      await expectCode(
        service.register({ ...req, endpointUrl: `not a url ${tok}` }),
        "invalid_request",
      );
    });
  });

  describeIfPostgres("on real PostgreSQL", () => {
    it("lets exactly one of two gateway processes (two pools) register one nonce", async () => {
      const pools = [0, 1].map(() => new pg.Pool({ connectionString: database.url!, max: 2 }));
      try {
        const services = pools.map((db) =>
          createRegistrationService({
            ...deps,
            recordRegistration: (nonce, reg) => recordRegistration(db, nonce, reg),
          }),
        );
        for (let round = 0; round < 5; round++) {
          const { req } = await signedRequest(offerId, viemSigner(roles.operator));
          const results = await Promise.allSettled(services.map((s) => s.register(req)));
          expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(1);
          const rejected = results.find((r) => r.status === "rejected") as PromiseRejectedResult;
          expect(rejected.reason).toMatchObject({ code: "nonce_used" });
        }
      } finally {
        await Promise.all(pools.map((p) => p.end()));
      }
    });
  });

  // Last: it stops the chain.
  describe("when the chain is down", () => {
    it("answers chain_unavailable", async () => {
      const { req } = await signedRequest(offerId, viemSigner(roles.operator));
      await anvil.stop();
      const a = await expectCode(service.register(req), "chain_unavailable");
      expect(httpStatusOf(a.code)).toBe(503);
      await expectCode(
        service.createChallenge({ offerId, endpointUrl: uniqueUrl("down") }),
        "chain_unavailable",
      );
    });
  });

  describe("secrets", () => {
    it("never put an endpoint URL or token in an error message", () => {
      expect(seenMessages.length).toBeGreaterThan(20);
      for (const message of seenMessages) {
        for (const secret of usedSecrets) expect(message).not.toContain(secret);
      }
    });
  });
});
