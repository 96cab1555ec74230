#!/bin/sh
# fetch_movielens.sh [OUT.csv]   (default: data/movielens_ratings.csv)
#
# MovieLens "latest-small" (GroupLens, 2016: 100,004 ratings, 671 users,
# 9,066 movies) from Debian's r-cran-dslabs package (R object `movielens`).
# Columns: movieId,title,year,genres,userId,rating,timestamp.
# Needs apt-get and Rscript (r-base-core); see fetch_r_dataset.sh.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec sh "$here/fetch_r_dataset.sh" r-cran-dslabs dslabs movielens "${1:-data/movielens_ratings.csv}"
