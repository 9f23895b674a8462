/** True when dist/ is missing, unfinished, or older than one of its inputs. */
export function isStale(): boolean;
/** Builds dist/ now (the caller holds no lock: use {@link buildIfStale} from other programs). */
export function build(): void;
/** Builds dist/ under the build lock unless it is fresh; true when it built. */
export function buildIfStale(): boolean;
