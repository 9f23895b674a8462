import { getAddress, type PublicClient } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { createChainSignatureVerifier } from "../adapters/chain/signatures.js";
import { createX402Chain } from "../adapters/chain/x402.js";
import type { Database } from "../adapters/pg/database.js";
import { createReceiptSigner } from "../adapters/crypto/receipt-signer.js";
import { createPgX402Store } from "../adapters/pg/x402.js";
import { buildUsageReceipt } from "../domain/receipts.js";
import type { Config } from "../config.js";
import type { X402Payments } from "../domain/x402/index.js";

/**
 * x402 payments (issue 37) are taken when enabled and the gateway has a settlement key: the
 * settlement operator is the only account the Market takes their settlement from, so a gateway
 * without one could verify a payment and never collect it.
 */
export function x402Active(config: Config): boolean {
  return config.x402Enabled && config.settlementPrivateKey !== undefined;
}

/** Seconds a payment's signature must still be valid when its request is admitted. */
const minValiditySeconds = 60;

export function wireX402(
  config: Config,
  deps: { readonly db: Database; readonly chain: PublicClient },
): X402Payments | undefined {
  if (!x402Active(config)) return undefined;
  const operator = privateKeyToAccount(config.settlementPrivateKey!).address;
  const market = getAddress(config.marketAddress);
  const onChain = createX402Chain({ client: deps.chain, market, operator });
  const receiptSigner =
    config.receiptPrivateKey === undefined
      ? undefined
      : createReceiptSigner(config.receiptPrivateKey);
  return {
    terms: { chainId: config.chainId, market, maxTimeoutSeconds: config.x402MaxTimeoutSeconds },
    minValiditySeconds,
    contractSigner: createChainSignatureVerifier(deps.chain),
    store: createPgX402Store(deps.db.pool, {
      perPayer: config.x402PayerExposureCap,
      perDeployment: config.x402DeploymentExposureCap,
    }),
    simulate: (payment, amount, offerId, permitId) =>
      onChain.simulate(payment, amount, offerId, permitId),
    // The receipt a paid stream ends with, signed as GET /v1/requests/{id}/receipt signs it.
    receipt:
      receiptSigner === undefined
        ? undefined
        : (record) =>
            receiptSigner.sign(
              buildUsageReceipt(record, { chainId: config.chainId, market: config.marketAddress }),
            ),
    assetDomain: (token) => onChain.assetDomain(token),
  };
}
