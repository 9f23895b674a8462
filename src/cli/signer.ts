import { readFile } from "node:fs/promises";
import { BaseError } from "../domain/base-error.js";
import { Wallet } from "ethers";
import type { Hex, LocalAccount } from "viem";
import { privateKeyToAccount } from "viem/accounts";

/** The signer could not be loaded as asked (a usage problem: exit 2). */
export class SignerUsageError extends BaseError {
  override readonly name = "SignerUsageError";
  readonly reason = "usage";
}

/**
 * The account a CLI command signs with, which never leaves this process: an encrypted JSON
 * keystore (`--keystore FILE` with KEYSTORE_PASSWORD), else the private key in `variable`
 * (OPERATOR_PRIVATE_KEY for `provider register`, PAYER_PRIVATE_KEY for `permit`). Messages
 * never include the key.
 */
export async function loadSigner(
  keystore: string | undefined,
  env: NodeJS.ProcessEnv,
  variable: string,
): Promise<LocalAccount> {
  if (keystore !== undefined) {
    const password = env.KEYSTORE_PASSWORD;
    if (password === undefined)
      throw new SignerUsageError("--keystore needs KEYSTORE_PASSWORD in the environment");
    const wallet = await Wallet.fromEncryptedJson(await readFile(keystore, "utf8"), password).catch(
      () => {
        throw new SignerUsageError("cannot decrypt the keystore (wrong file or password)");
      },
    );
    return privateKeyToAccount(wallet.privateKey as Hex);
  }
  const key = env[variable]?.trim();
  if (key === undefined || key === "") {
    throw new SignerUsageError(`set ${variable} or pass --keystore FILE`);
  }
  if (!/^0x[0-9a-fA-F]{64}$/.test(key))
    throw new SignerUsageError(`${variable} must be 0x + 64 hex digits`);
  return privateKeyToAccount(key as Hex);
}
