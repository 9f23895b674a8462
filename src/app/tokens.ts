import type { Logger } from "pino";
import {
  createTokenCounters,
  type TokenizerCounters,
} from "../adapters/tokenizers/token-counters.js";
import type { Config } from "../config.js";

/**
 * The gateway's token counters: the embedded tokenizer registry with TOKENIZER_REGISTRY's over
 * it. Awaited first by the composition root, so a missing or changed tokenizer file stops the
 * gateway before anything starts, naming the file. Nothing is loaded yet: the composition root
 * calls `preload` with the active offers' models at start and the indexer with each model it
 * adds (a model is routable once its tokenizer is loaded; `loading()` names those still
 * loading, for /ready), and the log says how long each load took. `close` stops the count
 * pool's worker at shutdown.
 */
export function wireTokens(config: Config, logger: Logger): Promise<TokenizerCounters> {
  return createTokenCounters({
    registryFile: config.tokenizerRegistry,
    onLoad: (tokenizer, ms) => logger.info({ tokenizer, ms: Math.round(ms) }, "tokenizer loaded"),
  });
}
