package canary.bench;

import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;

/**
 * Raw little-endian files in, raw little-endian bytes out.
 *
 * <p>The benchmark's Python side writes the data once with numpy ({@code tofile} / {@code .npy})
 * and every Spark partition reads only its own byte range, so no row crosses py4j. Results go
 * back as one {@code byte[]} (py4j passes byte arrays by value, in one message) that Python
 * reads with {@code np.frombuffer(..., "<f8")}.
 */
public final class Io {
    private static final int CHUNK = 1 << 26; // 64 MiB reads: bounded buffer, few syscalls

    private Io() {}

    /** A tiny call that proves the jar is on the py4j gateway's class path. */
    public static String version() {
        return "canary.bench 1";
    }

    /** Bounds of {@code parts} row ranges over {@code n} rows, as {@code np.array_split}: the
     *  first {@code n % parts} ranges get one row more. Range p is [lo[p], lo[p + 1]). */
    public static long[] split(long n, int parts) {
        long[] lo = new long[parts + 1];
        long q = n / parts, r = n % parts;
        for (int p = 0; p < parts; p++) {
            lo[p + 1] = lo[p] + q + (p < r ? 1 : 0);
        }
        return lo;
    }

    /** Partition ids 0..parts-1, the seed of an RDD whose partition p reads range p. */
    public static List<Integer> ids(int parts) {
        List<Integer> out = new ArrayList<>(parts);
        for (int p = 0; p < parts; p++) {
            out.add(p);
        }
        return out;
    }

    private static ByteBuffer read(FileChannel ch, long pos, int bytes) throws IOException {
        ByteBuffer buf = ByteBuffer.allocate(bytes).order(ByteOrder.LITTLE_ENDIAN);
        while (buf.hasRemaining()) {
            if (ch.read(buf, pos + buf.position()) < 0) {
                throw new EOFException("short file at byte " + (pos + buf.position()));
            }
        }
        buf.flip();
        return buf;
    }

    /** {@code count} float64 values starting {@code offset} bytes into {@code path}. */
    public static double[] readDoubles(String path, long offset, int count) throws IOException {
        double[] out = new double[count];
        try (FileChannel ch = FileChannel.open(Paths.get(path), StandardOpenOption.READ)) {
            for (int done = 0; done < count; ) {
                int want = Math.min(count - done, CHUNK / 8);
                read(ch, offset + 8L * done, 8 * want).asDoubleBuffer().get(out, done, want);
                done += want;
            }
        }
        return out;
    }

    /** {@code count} int64 values starting {@code offset} bytes into {@code path}. */
    public static long[] readLongs(String path, long offset, int count) throws IOException {
        long[] out = new long[count];
        try (FileChannel ch = FileChannel.open(Paths.get(path), StandardOpenOption.READ)) {
            for (int done = 0; done < count; ) {
                int want = Math.min(count - done, CHUNK / 8);
                read(ch, offset + 8L * done, 8 * want).asLongBuffer().get(out, done, want);
                done += want;
            }
        }
        return out;
    }

    /** The arrays one after the other as little-endian float64 bytes. */
    public static byte[] toBytes(double[]... arrays) {
        int total = 0;
        for (double[] a : arrays) {
            total += a.length;
        }
        ByteBuffer buf = ByteBuffer.allocate(8 * total).order(ByteOrder.LITTLE_ENDIAN);
        for (double[] a : arrays) {
            buf.asDoubleBuffer().put(a);
            buf.position(buf.position() + 8 * a.length);
        }
        return buf.array();
    }
}
