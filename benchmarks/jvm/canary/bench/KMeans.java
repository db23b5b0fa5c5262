package canary.bench;

import java.util.Collections;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;

/**
 * Lloyd's k-means as a Spark JVM user writes it: one cached {@code double[]} block of rows per
 * partition; per iteration {@code mapPartitions} assigns each row to its nearest centre (squared
 * Euclidean distance, the lowest index on a tie) and returns per-centre sums and counts,
 * {@code reduce} adds them, and every centre with a point moves to its points' mean (an empty
 * centre stays): what {@code _km_block_stats} / {@code _km_update} in benchmarks/apps.py do.
 */
public final class KMeans {
    private KMeans() {}

    /**
     * Runs {@code iters} Lloyd steps over the {@code n x d} C-order float64 array stored
     * {@code offset} bytes into {@code path} (the data of a {@code .npy} file), split into
     * {@code parts} partitions as {@code np.array_split}, from the first {@code k} rows as
     * centres.
     *
     * @return little-endian float64 bytes: [seconds of each iteration (iters), final centres
     *     row-major (k * d), seconds to load and cache the data (1)]
     */
    public static byte[] run(JavaSparkContext jsc, String path, long offset, int n, int d, int k,
                             int parts, int iters) throws java.io.IOException {
        final long[] lo = Io.split(n, parts);
        long t0 = System.nanoTime();
        JavaRDD<double[]> blocks = jsc.parallelize(Io.ids(parts), parts)
            .map(p -> Io.readDoubles(path, offset + 8L * d * lo[p],
                                     Math.toIntExact(d * (lo[p + 1] - lo[p]))))
            .cache();
        blocks.count();
        double load = (System.nanoTime() - t0) / 1e9;
        double[] centres = Io.readDoubles(path, offset, k * d);
        double[] seconds = new double[iters];
        for (int it = 0; it < iters; it++) {
            long start = System.nanoTime();
            final double[] c = centres;
            double[] stats = blocks.mapPartitions(rows -> {
                double[] acc = new double[k * d + k]; // sums (k * d), then counts (k)
                while (rows.hasNext()) {
                    double[] b = rows.next();
                    for (int o = 0; o < b.length; o += d) {
                        int best = 0;
                        double bestD = Double.POSITIVE_INFINITY;
                        for (int j = 0; j < k; j++) {
                            double s = 0.0;
                            for (int m = 0; m < d; m++) {
                                double t = b[o + m] - c[j * d + m];
                                s += t * t;
                            }
                            if (s < bestD) {
                                bestD = s;
                                best = j;
                            }
                        }
                        for (int m = 0; m < d; m++) {
                            acc[best * d + m] += b[o + m];
                        }
                        acc[k * d + best] += 1.0;
                    }
                }
                return Collections.singletonList(acc).iterator();
            }).reduce((a, b) -> {
                for (int j = 0; j < a.length; j++) {
                    a[j] += b[j];
                }
                return a;
            });
            double[] next = centres.clone();
            for (int j = 0; j < k; j++) {
                double cnt = stats[k * d + j];
                if (cnt > 0) {
                    for (int m = 0; m < d; m++) {
                        next[j * d + m] = stats[j * d + m] / cnt;
                    }
                }
            }
            centres = next;
            seconds[it] = (System.nanoTime() - start) / 1e9;
        }
        blocks.unpersist(true);
        return Io.toBytes(seconds, centres, new double[] {load});
    }
}
