"""faster-whisper on one recording, as bench-transcribe runs sluice: the
model loaded once, transcribed REPS times after one warm-up (greedy, no
timestamps, no VAD, English), the median printed as one JSON line.

    whisper_baseline.py CT2_MODEL_DIR AUDIO_FILE REPS COMPUTE_TYPE THREADS
"""

import json
import statistics
import sys
import time

from faster_whisper import WhisperModel


def main(model_dir, audio, reps, compute_type, threads):
    model = WhisperModel(model_dir, device="cpu", compute_type=compute_type, cpu_threads=threads)
    totals, text = [], ""
    for rep in range(reps + 1):
        started = time.perf_counter()
        segments, _ = model.transcribe(audio, language="en", beam_size=1, temperature=0.0,
                                       without_timestamps=True, condition_on_previous_text=False,
                                       vad_filter=False)
        text = "".join(s.text for s in segments).strip()  # the segments are lazy: this runs it
        if rep:
            totals.append(time.perf_counter() - started)
    print(json.dumps({"total_s": statistics.median(totals), "text": text}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
