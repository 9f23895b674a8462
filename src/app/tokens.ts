import type { Logger } from "pino";
import {
  createTokenCounters,
  type TokenizerCounters,
} from "../adapters/tokenizers/token-counters.js";
import type { Config } from "../config.js";

/**
 * The gateway's token counters: the embedded tokenizer registry with TOKENIZER_REGISTRY's over
 * it. Awaited first by the composition root, so a missing or changed tokenizer file stops the
 * gateway before anything starts, naming the file; each tokenizer is parsed when its first
 * model is served, and the log says how long that took.
 */
export function wireTokens(config: Config, logger: Logger): Promise<TokenizerCounters> {
  return createTokenCounters({
    registryFile: config.tokenizerRegistry,
    onLoad: (tokenizer, ms) => logger.info({ tokenizer, ms: Math.round(ms) }, "tokenizer loaded"),
  });
}
