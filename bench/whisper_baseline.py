"""faster-whisper on recordings, as bench-transcribe runs sluice: COPIES of
the file transcribed at once (one worker each, sharing THREADS CPU
threads; greedy, timestamps on, no fallback, no conditioning on the
previous window, no VAD, English: transformers' long-form defaults, which
sluice follows), one JSON line: audio seconds, wall seconds, segments, the
first copy's text.

    whisper_baseline.py CT2_MODEL_DIR AUDIO_FILE COPIES COMPUTE_TYPE THREADS
"""

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from faster_whisper import WhisperModel


def main(model_dir, audio, copies, compute_type, threads):
    model = WhisperModel(model_dir, device="cpu", compute_type=compute_type, cpu_threads=threads,
                         num_workers=copies)

    def one(_):
        segments, info = model.transcribe(audio, language="en", beam_size=1, temperature=0.0,
                                          without_timestamps=False, condition_on_previous_text=False,
                                          vad_filter=False)
        segments = list(segments)  # lazy: this runs it
        return info.duration, segments

    one(0)  # warm-up: the first call's costs out of the figure
    started = time.perf_counter()
    with ThreadPoolExecutor(copies) as pool:
        done = list(pool.map(one, range(copies)))
    total = time.perf_counter() - started
    print(json.dumps({
        "audio_s": sum(d for d, _ in done),
        "total_s": total,
        "segments": len(done[0][1]),
        "text": "".join(s.text for s in done[0][1]).strip(),
    }))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
