import type { Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { receiptDigest, type ReceiptSigner } from "../../domain/receipts.js";
import type { UsageReceiptTypedData } from "../../domain/receipt-types.js";
import { setBounded } from "../../domain/bounded-cache.js";

/** Signatures remembered by digest (a few MB at most). */
const defaultCacheEntries = 10_000;

/**
 * The gateway's receipt signer on `privateKey` (RECEIPT_PRIVATE_KEY). The key is held only by
 * viem's account inside this closure: the object returned carries the address and a `sign`
 * method, nothing a logger or a serialiser could reveal the key through.
 *
 * A signature costs about a millisecond of CPU; one made is remembered by the receipt's digest
 * (the digest covers every signed byte, so a record changed since gets a fresh signature), and a
 * payer who lists a permit's receipts again costs hashing only.
 */
export function createReceiptSigner(
  privateKey: Hex,
  options: { readonly cacheEntries?: number } = {},
): ReceiptSigner {
  const account = privateKeyToAccount(privateKey);
  const maxEntries = options.cacheEntries ?? defaultCacheEntries;
  const signatures = new Map<Hex, Hex>();
  return {
    address: account.address,
    async sign(receipt: UsageReceiptTypedData) {
      const digest = receiptDigest(receipt);
      let signature = signatures.get(digest);
      if (signature === undefined) {
        signature = await account.sign({ hash: digest });
        setBounded(signatures, digest, signature, maxEntries);
      }
      return { receipt, signature, signer: account.address };
    },
  };
}
